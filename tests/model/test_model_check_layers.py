"""check-model --layers N: the first N decoder layers of both checkpoints, on the converted smoke checkpoint (4 layers,
layer 0 dense, layers 1-3 MoE with group-limited routing). The end-to-end runs are their own processes, as in
test_model_check.py; the option and checkpoint checks run in this process (they fail before any model is built)."""

from __future__ import annotations

import json
import pickle
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

from r1_ascend.weights import layer_check, model_check
from r1_ascend.weights.errors import CheckpointFormatError

_LAYER = re.compile(r"^(?:model|decoder)\.layers\.(\d+)\.")


def _first_layers_only(name: str, layers: int) -> bool:
    match = _LAYER.match(name)
    return match is None or int(match.group(1)) < layers


def strip_layers(weights: Path, out: Path, layers: int) -> Path:
    """A copy of the checkpoint pair whose HF index and DCP metadata list only layers < ``layers``: the other
    layers' bytes are still in the files, but nothing can locate them."""
    shutil.copytree(weights / "hf-bf16", out / "hf-bf16")
    shutil.copytree(weights / "mcore", out / "mcore")
    index_path = out / "hf-bf16" / "model.safetensors.index.json"
    index = json.loads(index_path.read_text(encoding="utf-8"))
    index["weight_map"] = {k: v for k, v in index["weight_map"].items() if _first_layers_only(k, layers)}
    index_path.write_text(json.dumps(index), encoding="utf-8")
    meta_path = out / "mcore" / ".metadata"
    with meta_path.open("rb") as f:
        meta = pickle.load(f)
    meta.state_dict_metadata = {k: v for k, v in meta.state_dict_metadata.items() if _first_layers_only(k, layers)}
    meta.storage_data = {k: v for k, v in meta.storage_data.items() if _first_layers_only(k.fqn, layers)}
    meta.mcore_data = {k: v for k, v in meta.mcore_data.items() if _first_layers_only(k, layers)}
    with meta_path.open("wb") as f:
        pickle.dump(meta, f)
    return out


def check_args(weights: Path, *extra: str) -> list[str]:
    return ["--cpu", "--hf-dir", str(weights / "hf-bf16"), "--dist-ckpt", str(weights / "mcore"), *extra]


# --- option and checkpoint checks (fast) ------------------------------------------------------------------------


def test_default_layers_cover_the_dense_layers_and_one_moe_layer() -> None:
    assert layer_check.default_layers({"num_hidden_layers": 61, "first_k_dense_replace": 3}) == 4
    assert layer_check.default_layers({"num_hidden_layers": 4, "first_k_dense_replace": 1}) == 2
    assert layer_check.default_layers({"num_hidden_layers": 2, "first_k_dense_replace": 3}) == 2


@pytest.mark.parametrize(("layers", "message"), [(0, "at least one decoder layer"), (5, "has only 4 decoder layers")])
def test_bad_layer_count_is_refused_before_any_model_is_built(
    converted: Path, layers: int, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert model_check.main(check_args(converted, "--layers", str(layers))) == 2
    err = capsys.readouterr().err
    assert message in err
    assert f"--layers {layers}" in err


def test_a_checkpoint_without_the_layers_is_refused(
    converted: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stripped = strip_layers(converted, tmp_path, 2)
    assert model_check.main(check_args(stripped, "--layers", "3")) == 2
    assert "lacks 62 tensor(s) the first 3 layers need: ['model.layers.2." in capsys.readouterr().err
    shutil.copy(converted / "hf-bf16" / "model.safetensors.index.json", stripped / "hf-bf16")  # HF complete again
    assert model_check.main(check_args(stripped, "--layers", "3")) == 2
    assert "lacks decoder layer(s) [2] needed by --layers 3; it has layers 0..1" in capsys.readouterr().err


def test_a_stacked_layer_checkpoint_is_refused_with_the_reason() -> None:
    metadata = SimpleNamespace(state_dict_metadata={"decoder.layers.self_attention.linear_proj.weight": None})
    with pytest.raises(CheckpointFormatError, match="stacked along a layer axis"):
        layer_check.dist_layers(metadata, Path("ckpt"))


def test_estimate_of_deepseek_v3_matches_its_parameter_count() -> None:
    """The whole model's count is the published 671,026,419,200; N = 4 is the first 3 dense layers and one MoE
    layer plus the embedding and output layer."""
    from r1_ascend.launch.smoke_model import DEEPSEEK_V3_DIMS
    from r1_ascend.weights.tiny import deepseek_v3_config

    v3 = deepseek_v3_config(
        **DEEPSEEK_V3_DIMS, num_hidden_layers=61, first_k_dense_replace=3, n_routed_experts=256, n_shared_experts=1
    )
    assert layer_check.estimate(v3, 61, 2).parameters == 671_026_419_200
    four = layer_check.estimate(v3, 4, 4)
    assert four.parameters == 15_111_101_696
    assert four.peak_bytes == 2 * 4 * four.parameters
    assert "15.11 B parameters" in four.describe("fp32")


# --- the check itself (subprocesses) ----------------------------------------------------------------------------


@pytest.mark.slow
def test_first_layers_match_transformers(converted: Path, run_check: Callable) -> None:
    code, result, output = run_check(converted, "--dist-ckpt", str(converted / "mcore"), "--layers")
    assert code == 0, output[-3000:]
    assert result["layers"] == 2  # the default: first_k_dense_replace + 1
    assert result["max_logit_gap"] < 1e-4
    assert result["mean_abs_logprob_gap"] < 1e-5
    assert "first 2 layers" in output
    assert "reads 5.2 MB from each checkpoint" in output
    config = json.loads((converted / "hf-bf16" / "config.json").read_text(encoding="utf-8"))
    experts_bias = config["n_routed_experts"]  # one MoE layer; a buffer, not a parameter, in Megatron
    assert layer_check.estimate(config, 2, 4).parameters == result["megatron_parameters"] + experts_bias


@pytest.mark.slow
def test_ungrouped_routing_is_caught_in_the_first_moe_layer(converted: Path, run_check: Callable) -> None:
    env = {"R1_ASCEND_DISABLE": "verl_dpskv3_group_routing"}
    code, result, output = run_check(converted, "--dist-ckpt", str(converted / "mcore"), "--layers", "2", env=env)
    assert code == 1, output[-3000:]
    assert result["layers"] == 2
    assert result["mean_abs_logprob_gap"] > 100 * model_check.TOLERANCES["fp32"][1]  # far outside the tolerance
    assert "group-limited routing" in output


@pytest.mark.slow
def test_only_the_first_layers_are_read(converted: Path, run_check: Callable, tmp_path: Path) -> None:
    """Passes on a checkpoint pair in which no layer >= 2 can even be located."""
    stripped = strip_layers(converted, tmp_path, 2)
    code, result, output = run_check(stripped, "--dist-ckpt", str(stripped / "mcore"), "--layers", "2")
    assert code == 0, output[-3000:]
    assert result["max_logit_gap"] < 1e-4


@pytest.mark.slow
def test_truncated_models_equal_full_models_cut_by_hand(converted: Path, tmp_path: Path) -> None:
    import os

    from r1_ascend.rehearse.cluster import with_site

    out = tmp_path / "reference.json"
    script = Path(__file__).with_name("layer_reference.py")
    env = with_site(os.environ)
    done = subprocess.run(
        [sys.executable, str(script), str(converted), "2", str(out)],
        capture_output=True,
        text=True,
        check=False,
        env=env,
        timeout=900,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    result = json.loads(out.read_text(encoding="utf-8"))
    assert result["megatron_layers"] == result["transformers_layers"] == 2
    assert result["megatron_vs_cut"] == 0.0
    assert result["transformers_vs_cut"] == 0.0
    # the cut matters (the comparison is not vacuous): far above the gap allowed between equal models
    assert result["truncated_vs_full"] > 100 * model_check.TOLERANCES["fp32"][0]
