"""The weight-sync check (``verl_weight_sync_check``) on the real model path: every weight / layout fault of
``r1_ascend.rehearse.rollout_faults``, planted where its class lives, is stopped at its sync in seeds 0-4 with a
message naming the tensor, and no healthy sync is.

Two worlds of ``weight_check_child.py``: one process (megatron-core's actor, verl's export, the CPU engine through
vLLM's DeepSeek-V3 ``load_weights``) for every fault one rank can carry, and four ranks for those that need more:
the actor at PP 2 x EP 2 (a stale pipeline stage, a wrong EP gather) and the rollout at TP 2 x DP 2 / EP 4 (an expert
on the wrong EP rank, one tensor's TP shards exchanged). The loader faults at TP 1, TP 2 / EP 2 and TP 2 x DP 2 / EP 4
against vLLM's loader alone: test_vllm_deepseek_load.py. The check in verl's real loop:
tests/launch/test_rehearse_rollout_fault.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from r1_ascend.ports import unused_local_port
from r1_ascend.rehearse import rollout_faults

pytestmark = pytest.mark.slow

CHILD = Path(__file__).with_name("weight_check_child.py")
SEEDS = ("0", "1", "2", "3", "4")
_EXPERT = r"model\.layers\.1\.mlp\.experts\.\d+\.(gate|up|down)_proj\.weight"
#: The tensor each fault's stop must name (``HF tensor -> engine tensor or share``).
NAMED = {
    "not-synced": r"lm_head\.weight, model\.embed_tokens\.weight, .* none reached vLLM's load_weights",
    "previous-sync-sent": r"lm_head\.weight -> share 0 .*the rollout received other values than the actor's own",
    "stale-layers": r"model\.layers\.[23]\.\S+ -> model\.layers\.[23]\.\S+: vLLM holds other values",
    "expert-swap": rf"{_EXPERT} -> model\.layers\.1\.mlp\.experts\.w(13|2)_weight\[\d+",
    "expert-transposed": r"experts\.\d+\.down_proj\.weight -> model\.layers\.1\.mlp\.experts\.w2_weight\[\d+\]",
    "expert-negated": r"experts\.\d+\.down_proj\.weight -> model\.layers\.1\.mlp\.experts\.w2_weight\[\d+\]",
    "stale-bias": r"model\.layers\.\d\.mlp\.gate\.e_score_correction_bias -> share 0",
    "bias-missing": r"mlp\.gate\.e_score_correction_bias -> model\.layers\.\d\.mlp\.gate\.\S+: not received",
    "converter-gate-up": r"model\.layers\.\d\.mlp\.(shared_experts\.)?(gate|up)_proj\.weight -> share 0",
    "converter-mla-norm": r"model\.layers\.\d\.self_attn\.kv_a_layernorm\.weight -> share 0",
    "kv-b-proj-halves": r"layers\.1\.self_attn\.kv_b_proj\.weight -> (model\.layers\.1\.self_attn\.kv_b_proj|W_U)",
    "mla-not-recomputed": r"self_attn\.kv_b_proj\.weight -> W_U(K_T|V) of layer \d",
    "w13-swap": rf"{_EXPERT} -> model\.layers\.1\.mlp\.experts\.w13_weight",
    "wrong-ep-rank": rf"{_EXPERT} -> model\.layers\.1\.mlp\.experts\.w(13|2)_weight",
    "expert-transposed-load": r"experts\.0\.down_proj\.weight -> model\.layers\.1\.mlp\.experts\.w2_weight\[0\]",
    "moe-loader-dropped": rf"{_EXPERT} -> model\.layers\.1\.mlp\.experts\.w(13|2)_weight",
    "expert-transposed-resume": rf"{_EXPERT} -> model\.layers\.1\.mlp\.experts\.w(13|2)_weight",
    "stale-stage": r"(lm_head|model\.layers\.\d\.\S+)\.weight -> share \d",
    "ep-gather-shifted": rf"{_EXPERT} -> share 0",
    "expert-wrong-rank": rf"{_EXPERT} -> model\.layers\.1\.mlp\.experts\.w(13|2)_weight\[0",
    "tp-shards-swapped": r"self_attn\.q_b_proj\.weight -> model\.layers\.1\.self_attn\.q_b_proj\.weight",
}
#: The faults the four-rank world plants (weight_check_child.WORLD_FAULTS).
IN_THE_WORLD = ("stale-stage", "ep-gather-shifted", "expert-wrong-rank", "tp-shards-swapped")


def _env() -> dict[str, str]:
    from r1_ascend.rehearse.cluster import with_site

    return with_site(os.environ)


@pytest.fixture(scope="module")
def one(converted: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("one") / "report.json"
    cmd = [sys.executable, str(CHILD), "one", str(converted), str(out), *SEEDS]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=1500, env=_env())
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    report = json.loads(out.read_text(encoding="utf-8"))
    report.pop("timings")
    return report


@pytest.fixture(scope="module")
def world(converted: Path, tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """Four ranks: the actor at PP 2 x EP 2, the rollout at TP 2 x DP 2 / EP 4."""
    base, port = tmp_path_factory.mktemp("world"), str(unused_local_port())
    layout = ("2", "2", "2")  # actor PP, actor EP, rollout DP
    children = [
        subprocess.Popen(
            [
                sys.executable,
                str(CHILD),
                "world",
                str(converted),
                "4",
                str(rank),
                port,
                str(base / f"{rank}.json"),
                *layout,
                *SEEDS,
            ],
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(4)
    ]
    logs = [child.communicate(timeout=1500)[0] for child in children]
    for child, log in zip(children, logs, strict=True):
        assert child.returncode == 0, log[-4000:]
    return [json.loads((base / f"{rank}.json").read_text(encoding="utf-8")) for rank in range(4)]


def _assert_stopped(name: str, message: str | None, seed: str) -> None:
    assert message is not None, f"{name} was not stopped by the weight check in seed {seed}"
    assert re.search(r"weight sync \d+ is wrong on \d+ of \d+ ranks", message), message
    assert re.search(NAMED[name], message), (name, seed, message[:600])
    if name != "not-synced":
        assert re.search(r"rank \d+, sync \d+: ", message), message[:400]
        assert "fingerprint expected proj" in message, "both fingerprints"
        assert "found proj" in message


def test_every_weight_fault_is_covered_here() -> None:
    """A new weight or layout fault gets its named tensor here, and a world that plants it."""
    weight_faults = {name for name, fault in rollout_faults.FAULTS.items() if fault.where != "config"}
    assert weight_faults == set(NAMED)


def test_healthy_syncs_pass_in_every_seed(one: dict, world: list[dict]) -> None:
    for seed in SEEDS:
        assert one[seed]["healthy"] == [None, None], seed
        for rank in world:
            assert set(rank["seeds"][seed]["healthy"]) == {None}, (seed, rank["seeds"][seed]["healthy"])


@pytest.mark.parametrize("name", sorted(n for n in NAMED if rollout_faults.get(n).needs is None))
def test_a_fault_one_rank_carries_is_stopped_at_its_sync_in_every_seed(one: dict, name: str) -> None:
    for seed in SEEDS:
        _assert_stopped(name, one[seed]["faults"][name], seed)


@pytest.mark.parametrize("name", IN_THE_WORLD)
def test_a_fault_of_a_wider_world_is_stopped_on_every_rank_in_every_seed(world: list[dict], name: str) -> None:
    for rank in world:
        assert name in rank["faults"]
        for seed in SEEDS:
            _assert_stopped(name, rank["seeds"][seed]["faults"][name], seed)
