"""The rollout's weights through vLLM's own DeepSeek-V3 ``load_weights`` (vllm-ascend's class, built on the CPU):
every HF tensor verl exports lands where vLLM's kernels read it, at TP 1, at TP 2 with EP 2, and at TP 2 x DP 2 with
EP 4 (the groups built by the overlay's vllm_dp_ep_groups); the weight-sync check's ownership rule agrees with vLLM's
real loader there (every healthy load passes its load check, in five seeds), and each layout fault the rehearsal
plants in vLLM's loader (gate/up swapped, an expert handed over transposed, experts in the wrong EP slot or on the
wrong EP rank, the experts' loaders dropped, one tensor's TP shards exchanged, kv_b_proj's halves) shows up and is
stopped by the check on every rank, naming the tensor (seeds 0-4 of each: test_weight_sync_check.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from r1_ascend.ports import unused_local_port
from r1_ascend.weights.tiny import deepseek_v3_config

pytestmark = pytest.mark.slow

CHILD = Path(__file__).with_name("vllm_deepseek_child.py")
EXPERT = r"model\.layers\.\d+\.mlp\.experts\.\d+\.(gate|up|down)_proj\.weight"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("vllm-deepseek")
    config = deepseek_v3_config()
    config.pop("quantization_config")  # the BF16 checkpoint the rollout loads
    (path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return path


def run_world(model_dir: Path, world: int, tmp_path: Path, dp: int = 1) -> list[dict]:
    from r1_ascend.rehearse.cluster import with_site

    env = with_site(os.environ)
    port = str(unused_local_port())
    outs = [tmp_path / f"rank{rank}.json" for rank in range(world)]
    children = [
        subprocess.Popen(
            [sys.executable, str(CHILD), str(model_dir), str(world), str(rank), port, str(out), str(dp)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank, out in enumerate(outs)
    ]
    logs = [child.communicate(timeout=600)[0] for child in children]
    for child, log in zip(children, logs, strict=True):
        assert child.returncode == 0, log[-3000:]
    return [json.loads(out.read_text(encoding="utf-8")) for out in outs]


@pytest.fixture(scope="module")
def tp1(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    return run_world(model_dir, 1, tmp_path_factory.mktemp("tp1"))[0]


@pytest.fixture(scope="module")
def ep2(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    return run_world(model_dir, 2, tmp_path_factory.mktemp("ep2"))


@pytest.fixture(scope="module")
def dp2(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """Rollout TP 2 x DP 2 (EP 4), the groups built by the overlay's vllm_dp_ep_groups as on the cluster."""
    return run_world(model_dir, 4, tmp_path_factory.mktemp("dp2"), dp=2)


@pytest.fixture
def layouts(tp1: dict, ep2: list[dict], dp2: list[dict]) -> dict[int, list[dict]]:
    """The ranks' reports by world size: TP 1; TP 2 with EP 2; TP 2 x DP 2 with EP 4."""
    return {1: [tp1], 2: ep2, 4: dp2}


def test_at_rollout_dp_2_the_overlays_groups_are_the_engines(dp2: list[dict]) -> None:
    """vllm_dp_ep_groups plans and builds TP {0,1},{2,3}, DP {0,2},{1,3} and EP over all four ranks; the engine's
    ParallelConfig reads DP 2 from the VLLM_DP_* it exported, and every MoE layer runs at EP 4."""
    for rank, report in enumerate(dp2):
        groups = report["groups"]
        assert groups["tp"] == groups["planned"]["tp_group"] == [rank // 2 * 2, rank // 2 * 2 + 1]
        assert groups["dp"] == groups["planned"]["dp_group"] == [rank % 2, rank % 2 + 2]
        assert groups["ep"] == groups["planned"]["ep_group"] == [0, 1, 2, 3]
        assert groups["data_parallel_size"] == 2
        assert set(groups["moe_ep_size"]) == {4}


def test_the_registry_builds_vllm_ascends_deepseek_class(tp1: dict) -> None:
    assert tp1["class"] == "vllm_ascend.models.deepseek_v2.CustomDeepseekV3ForCausalLM"


def test_every_exported_tensor_lands_where_vllm_reads_it(tp1: dict) -> None:
    healthy = tp1["healthy"]
    assert "load_error" not in healthy, healthy
    assert healthy["unwritten"] == [], "vLLM's load_weights wrote every parameter it has"
    assert healthy["missing"] == []
    assert healthy["differ"] == []


@pytest.mark.parametrize("world", [1, 2, 4])
def test_the_ownership_rule_agrees_with_vllms_loader_in_every_healthy_load(
    world: int, layouts: dict[int, list[dict]]
) -> None:
    """A healthy load, at every layout, passes the weight-sync check's load check on every rank: the rule (written
    from the layout, not the loader) says where vLLM's loader put each tensor, and where vLLM's MLA objects derived
    their matrices from (their TP share of the heads)."""
    for rank in layouts[world]:
        assert rank["healthy"]["check"] is None, rank["healthy"]["check"]


@pytest.mark.parametrize("world", [1, 2, 4])
def test_after_start_up_the_experts_load_only_with_verls_moe_loader_patch(
    world: int, layouts: dict[int, list[dict]]
) -> None:
    # vllm-ascend's process_weights_after_loading replaces w13/w2 by parameters without a weight_loader: vLLM's own
    # load_weights fails on them, verl's patch_vllm_moe_model_weight_loader (run by the sync) puts the loaders back,
    # and an update that skips the parameters without one leaves the experts stale: the weight check names them
    for rank in layouts[world]:
        assert "no attribute 'weight_loader'" in rank["unpatched"].get("load_error", ""), rank["unpatched"]
        _stopped(rank["moe-loader-dropped"]["check"], rf"{EXPERT} -> model\.layers\.\d+\.mlp\.experts\.w(13|2)_weight")


def test_the_routing_bias_is_held_in_the_model_dtype(tp1: dict) -> None:
    # vllm-ascend 0.9.1 (deepseek_v2.py:295-298) keeps e_score_correction_bias in float32 only with torchair's
    # super kernel; in eager mode it is bf16, while the actor and the checkpoint hold it in float32
    biases = {name: dtype for name, dtype in tp1["dtypes"].items() if name.endswith("e_score_correction_bias")}
    assert biases
    assert set(biases.values()) == {"torch.bfloat16"}


@pytest.mark.parametrize("world", [1, 2, 4])
def test_a_gate_up_swap_in_the_loader_is_seen_in_every_expert(world: int, layouts: dict[int, list[dict]]) -> None:
    for rank in layouts[world]:
        swapped = rank["w13-swap"]
        assert "load_error" not in swapped, swapped
        experts = [name for name in swapped["experts"] if name.endswith(("gate_proj.weight", "up_proj.weight"))]
        assert swapped["differ"] == sorted(experts)
        _stopped(swapped["check"], rf"{EXPERT} -> model\.layers\.\d+\.mlp\.experts\.w13_weight\[")


@pytest.mark.parametrize("world", [1, 2, 4])
def test_an_expert_handed_over_transposed_is_stopped_by_the_check_on_every_rank(
    world: int, layouts: dict[int, list[dict]]
) -> None:
    # laid back into its shape the loader copies it; vLLM's model then holds it transposed: the rank that holds
    # expert 0 names it, and every rank stops
    for rank in layouts[world]:
        transposed = rank["expert-transposed-load"]
        assert "load_error" not in transposed, transposed
        assert any(".experts.0.down_proj.weight" in name for name in transposed["differ"])
        _stopped(
            transposed["check"], r"experts\.0\.down_proj\.weight -> model\.layers\.\d+\.mlp\.experts\.w2_weight\[0\]"
        )


@pytest.mark.parametrize("world", [2, 4])
def test_every_tensor_is_whole_again_under_ep(world: int, layouts: dict[int, list[dict]]) -> None:
    for rank in layouts[world]:
        healthy = rank["healthy"]
        assert "load_error" not in healthy, healthy
        assert healthy["missing"] == []
        assert healthy["differ"] == []


@pytest.mark.parametrize("world", [2, 4])
def test_each_ep_rank_holds_its_share_of_the_experts_and_together_all(
    world: int, layouts: dict[int, list[dict]]
) -> None:
    config = deepseek_v3_config()
    ranks = layouts[world]
    layers = ranks[0]["healthy"]["held"].keys()
    assert len(layers) == config["num_hidden_layers"] - config["first_k_dense_replace"]
    for layer in layers:
        held = [set(rank["healthy"]["held"][layer]) for rank in ranks]
        assert sum(len(h) for h in held) == config["n_routed_experts"], "disjoint"
        assert set().union(*held) == set(range(config["n_routed_experts"]))
        assert {len(h) for h in held} == {config["n_routed_experts"] // world}


@pytest.mark.parametrize("world", [1, 2, 4])
def test_experts_in_the_wrong_ep_slot_are_seen(world: int, layouts: dict[int, list[dict]]) -> None:
    for rank in layouts[world]:
        wrong = rank["wrong-ep-rank"]
        assert "load_error" not in wrong
        assert wrong["differ"], "experts loaded into shifted slots read back as the source"
        _stopped(wrong["check"], rf"{EXPERT} -> model\.layers\.\d+\.mlp\.experts\.w(13|2)_weight")


#: The tensor each planted fault's stop names, at the worlds that carry it.
NAMED = {
    "w13-swap": rf"{EXPERT} -> model\.layers\.\d+\.mlp\.experts\.w13_weight",
    "expert-transposed-load": r"experts\.0\.down_proj\.weight -> model\.layers\.\d+\.mlp\.experts\.w2_weight\[0\]",
    "wrong-ep-rank": rf"{EXPERT} -> model\.layers\.\d+\.mlp\.experts\.w(13|2)_weight",
    "moe-loader-dropped": rf"{EXPERT} -> model\.layers\.\d+\.mlp\.experts\.w(13|2)_weight",
    "kv-b-proj-halves": r"layers\.1\.self_attn\.kv_b_proj\.weight -> (model\.layers\.1\.self_attn\.kv_b_proj|W_U)",
    "tp-shards-swapped": r"model\.layers\.1\.self_attn\.q_b_proj\.weight -> model\.layers\.1\.self_attn\.q_b_proj",
    "expert-wrong-rank": rf"{EXPERT} -> model\.layers\.\d+\.mlp\.experts\.w(13|2)_weight\[0",
}


@pytest.mark.parametrize("world", [1, 2, 4])
def test_every_loader_fault_is_stopped_on_every_rank(world: int, layouts: dict[int, list[dict]]) -> None:
    """One TP shard swapped needs TP 2, an expert on the wrong EP rank EP 2: both at worlds 2 and 4. Seeds 0-4 of
    every fault: test_weight_sync_check.py."""
    for rank in layouts[world]:
        if world > 1:
            assert {"tp-shards-swapped", "expert-wrong-rank"} <= set(rank["wider"])
        for name in ["w13-swap", "expert-transposed-load", "wrong-ep-rank", "moe-loader-dropped", *rank["wider"]]:
            _stopped(rank[name]["check"], NAMED[name])


def _stopped(message: str | None, named: str) -> None:
    assert message is not None, "not stopped by the weight check"
    assert re.search(r"weight sync \d+ is wrong on \d+ of \d+ ranks", message), message[:300]
    assert re.search(named, message), message[:600]
    assert "fingerprint expected proj" in message
