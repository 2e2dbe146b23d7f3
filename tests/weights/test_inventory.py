"""The tensor inventory config.json implies, fuzzed over DeepSeek-V3-shaped configs, and every step checking it."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

from r1_ascend.weights import CheckpointFormatError, Layout, convert_fp8_to_bf16, convert_hf_to_megatron
from r1_ascend.weights.config_fix import fix_checkpoint
from r1_ascend.weights.inventory import expected_tensors
from r1_ascend.weights.mcore_plan import build_plan
from r1_ascend.weights.mcore_verify import check_megatron_inventory
from r1_ascend.weights.pipeline import convert_all
from r1_ascend.weights.tiny import deepseek_v3_config, make_tiny

INDEX = "model.safetensors.index.json"


@st.composite
def v3_configs(draw: st.DrawFn, small: bool = False) -> dict:
    dim = st.integers(1, 24) if small else st.integers(1, 700)
    layers = draw(st.integers(1, 3 if small else 8))
    return deepseek_v3_config(
        vocab_size=draw(dim),
        hidden_size=draw(dim),
        intermediate_size=draw(dim),
        moe_intermediate_size=draw(dim),
        num_hidden_layers=layers,
        first_k_dense_replace=draw(st.integers(0, layers)),
        num_attention_heads=draw(st.integers(1, 6)),
        n_routed_experts=draw(st.integers(1, 4 if small else 300)),
        n_shared_experts=draw(st.integers(1, 2)),
        q_lora_rank=draw(st.one_of(st.none(), dim)),
        kv_lora_rank=draw(dim),
        qk_nope_head_dim=draw(st.integers(1, 40)),
        qk_rope_head_dim=draw(st.integers(1, 40)),
        v_head_dim=draw(st.integers(1, 40)),
        num_nextn_predict_layers=draw(st.integers(0, 2)),
    )


def _layer_counts(cfg: dict, moe: bool, mtp: bool) -> tuple[int, int]:
    """(tensors, FP8 weights) of one layer, counted from the architecture description, not from the code."""
    attn = (7, 5) if cfg["q_lora_rank"] else (5, 4)  # q_a, q_a_ln, q_b | q_proj; kv_a, kv_a_ln, kv_b, o
    norms = 2
    e = cfg["n_routed_experts"]
    mlp = (3 * e + 3 + 2, 3 * e + 3) if moe else (3, 3)  # experts + shared + gate weight/bias | gate/up/down
    extra = 6 if mtp else 0  # enorm, hnorm, eh_proj, embed_tokens, shared_head.{norm,head}
    return attn[0] + norms + mlp[0] + extra, attn[1] + mlp[1]


@settings(max_examples=200, deadline=None)
@given(cfg=v3_configs(), fp8=st.booleans(), mtp=st.booleans())
def test_inventory_counts_match_the_architecture(cfg: dict, fp8: bool, mtp: bool) -> None:
    inv = expected_tensors(cfg, fp8=fp8, mtp=mtp)
    n_layers, k = cfg["num_hidden_layers"], cfg["first_k_dense_replace"]
    n_mtp = cfg["num_nextn_predict_layers"] if mtp else 0
    tensors, scales = 3, 0
    for layer in range(n_layers + n_mtp):
        t, f = _layer_counts(cfg, moe=layer >= k or layer >= n_layers, mtp=layer >= n_layers)
        tensors, scales = tensors + t, scales + f
    assert len(inv) == tensors + (scales if fp8 else 0)
    h, e = cfg["hidden_size"], cfg["n_routed_experts"]
    last = n_layers + n_mtp - 1
    if last >= max(k, 0) and (last >= k or last >= n_layers):
        assert f"model.layers.{last}.mlp.experts.{e - 1}.down_proj.weight" in inv
    assert inv["lm_head.weight"] == ("BF16", (cfg["vocab_size"], h))
    for name, (dtype, shape) in inv.items():
        if name.endswith("_scale_inv"):
            weight = inv[name.removesuffix("_scale_inv")]
            assert weight[0] == "F8_E4M3"
            assert shape == tuple(-(-d // 128) for d in weight[1])
        if name.endswith("e_score_correction_bias"):
            assert (dtype, shape) == ("F32", (e,))
    assert ("F8_E4M3" in {d for d, _ in inv.values()}) == fp8


def _mutated_copy(src: Path, dst: Path, *, drop: str | None = None, add: str | None = None) -> None:
    shutil.copytree(src, dst)
    index = json.loads((dst / INDEX).read_text())
    if drop:
        del index["weight_map"][drop]
    if add:
        save_file(
            {add: torch.zeros(2, dtype=torch.bfloat16)}, str(dst / "extra.safetensors"), metadata={"format": "pt"}
        )
        index["weight_map"][add] = "extra.safetensors"
    (dst / INDEX).write_text(json.dumps(index))


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=v3_configs(small=True), data=st.data())
def test_a_missing_or_extra_tensor_is_named_and_nothing_is_presented_as_complete(cfg: dict, data) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        tiny = make_tiny(root / "fp8", config_overrides=cfg, fast=True, max_shard_bytes=20_000)
        names = sorted(n for n in tiny.weight_map if not n.endswith("_scale_inv"))
        victim = data.draw(st.sampled_from(names), label="dropped tensor")
        _mutated_copy(tiny.path, root / "dropped", drop=victim)
        with pytest.raises(CheckpointFormatError, match=rf"missing: .*{victim.replace('.', '[.]')}"):
            convert_all(root / "dropped", root / "out", progress=False)
        assert not (root / "out" / "hf-bf16" / INDEX).exists()
        bogus = data.draw(st.sampled_from(["model.layers.99.mlp.gate.weight", "lm_head.bias", "model.rotary.inv"]))
        _mutated_copy(tiny.path, root / "extra", add=bogus)
        with pytest.raises(CheckpointFormatError, match=rf"not in the architecture: '{bogus.replace('.', '[.]')}'"):
            convert_fp8_to_bf16(root / "extra", root / "out2", progress=False)
        assert not (root / "out2").exists()
        convert_fp8_to_bf16(tiny.path, root / "bf16", progress=False)  # the unmodified checkpoint converts


def test_a_missing_bf16_tensor_stops_fp8_to_bf16(tiny_fp8, tmp_path: Path) -> None:
    """The reported case: a BF16 tensor removed from the FP8 input's index used to give exit 0 and a short output."""
    _mutated_copy(tiny_fp8.path, tmp_path / "src", drop="model.layers.1.mlp.gate.weight")
    with pytest.raises(CheckpointFormatError, match=r"1 missing: 'model\.layers\.1\.mlp\.gate\.weight'"):
        convert_fp8_to_bf16(tmp_path / "src", tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_missing_mtp_layer_is_named(tiny_fp8, tmp_path: Path) -> None:
    src = tmp_path / "src"
    _mutated_copy(tiny_fp8.path, src, drop="model.layers.3.eh_proj.weight")
    with pytest.raises(CheckpointFormatError, match=r"model\.layers\.3\.eh_proj\.weight"):
        convert_fp8_to_bf16(src, tmp_path / "out", progress=False)


def test_output_is_checked_before_the_index_is_written(tiny_fp8, tmp_path: Path, monkeypatch) -> None:
    """A shard that lost a tensor after it was written: no index (the completion marker) is written."""
    from r1_ascend.weights import dequant

    real = dequant.read_header

    def lossy(path, **kw):
        header = real(path, **kw)
        header.entries.pop("model.norm.weight", None)
        return header

    monkeypatch.setattr(dequant, "read_header", lossy)
    with pytest.raises(CheckpointFormatError, match=r"BF16 output .*missing: 'model\.norm\.weight'"):
        convert_fp8_to_bf16(tiny_fp8.path, tmp_path / "out", progress=False)
    assert not (tmp_path / "out" / INDEX).exists()


def test_fix_config_and_to_megatron_check_the_inventory(tiny_bf16: Path, tmp_path: Path) -> None:
    src = tmp_path / "bf16"
    _mutated_copy(tiny_bf16, src, drop="model.layers.2.mlp.experts.7.up_proj.weight")
    before = {p.name: p.read_bytes() for p in src.iterdir()}
    with pytest.raises(CheckpointFormatError, match=r"experts\.7\.up_proj"):
        fix_checkpoint(src)
    assert {p.name: p.read_bytes() for p in src.iterdir()} == before  # nothing touched
    with pytest.raises(CheckpointFormatError, match=r"experts\.7\.up_proj"):
        convert_hf_to_megatron(src, tmp_path / "mcore", progress=False)
    assert not (tmp_path / "mcore").exists()


def test_megatron_checkpoint_is_checked_against_the_config(tiny_bf16: Path, tmp_path: Path) -> None:
    out = tmp_path / "mcore"
    convert_hf_to_megatron(tiny_bf16, out, progress=False)
    cfg = json.loads((tiny_bf16 / "config.json").read_text())
    check_megatron_inventory(out, build_plan(cfg, Layout()))
    more_layers = {**cfg, "num_hidden_layers": cfg["num_hidden_layers"] + 1}
    with pytest.raises(CheckpointFormatError, match=r"missing: .*decoder\.layers\.3\."):
        check_megatron_inventory(out, build_plan(more_layers, Layout()))
    fewer_experts = {**cfg, "n_routed_experts": 4}
    with pytest.raises(CheckpointFormatError, match=r"wrong dtype or shape: decoder\.layers\.\d\.mlp\.experts"):
        check_megatron_inventory(out, build_plan(fewer_experts, Layout()))
