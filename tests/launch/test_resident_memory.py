"""Preflight's memory estimate counts what stays resident in both phases: rollout buffers, runner tensors, graph
memory and HCCL buffers (r1_ascend.launch.resident), on the real composed smoke configuration."""

from __future__ import annotations

import pytest

from r1_ascend.launch.checks import ERROR
from r1_ascend.launch.overlays import SMOKE_OVERLAY
from r1_ascend.launch.preflight import run_checks
from r1_ascend.launch.quickstart import SMOKE_ENV
from r1_ascend.launch.resident import HCCL_BUFFSIZE_DEFAULT_MB, MIB, hccl_buffsize_mb, hccl_communicators
from r1_ascend.parallel import Layout


def _memory(smoke_inputs, *overrides, env=SMOKE_ENV):
    run, findings = run_checks(SMOKE_OVERLAY, [*smoke_inputs.overrides(), *overrides], env=env)
    return run, findings


def test_both_phases_count_the_resident_items(smoke_inputs):
    run, _ = _memory(smoke_inputs)
    rollout, update = run.memory
    for phase in (rollout, update):
        names = [name for name, _ in phase.rows]
        assert any(name.startswith("rollout buffers kept") for name in names), names
        assert any(name.startswith("rollout runner tensors kept") for name in names), names
        assert any(name.startswith("TorchAir graph memory kept") for name in names), names
        assert any(name.startswith("HCCL buffers") for name in names), names
        assert all(value > 0 for name, value in phase.rows if "kept" in name or "HCCL" in name)


def test_hccl_buffers_follow_hccl_buffsize(smoke_inputs):
    run, _ = _memory(smoke_inputs)
    bigger, _ = _memory(smoke_inputs, env={**SMOKE_ENV, "HCCL_BUFFSIZE": str(3 * HCCL_BUFFSIZE_DEFAULT_MB)})
    communicators = hccl_communicators(run.train, run.rollout.tp, run.rollout.dp)
    assert len(communicators) >= 5
    for base, more in zip(run.memory, bigger.memory, strict=True):
        assert more.total - base.total == pytest.approx(2 * len(communicators) * 2 * HCCL_BUFFSIZE_DEFAULT_MB * MIB)


def test_free_cache_engine_off_counts_the_reservation_instead(smoke_inputs):
    run, _ = _memory(smoke_inputs, "actor_rollout_ref.rollout.free_cache_engine=false")
    names = [name for name, _ in run.memory[1].rows]
    assert "rollout reservation kept (free_cache_engine off)" in names
    assert not any(name.startswith("rollout buffers kept") for name in names)


def test_malformed_hccl_buffsize_is_a_finding(smoke_inputs):
    _, findings = _memory(smoke_inputs, env={**SMOKE_ENV, "HCCL_BUFFSIZE": "200MB"})
    assert any(f.check == "memory" and f.level == ERROR and "HCCL_BUFFSIZE='200MB'" in f.message for f in findings)


@pytest.mark.parametrize(("raw", "expected"), [(None, 200), ("", 200), ("512", 512)])
def test_hccl_buffsize_parsing(raw, expected):
    assert hccl_buffsize_mb({} if raw is None else {"HCCL_BUFFSIZE": raw}) == expected


def test_communicators_are_the_groups_with_more_than_one_rank():
    train = Layout(world=16, tp=2, pp=2, cp=1, ep=4, etp=1)
    assert hccl_communicators(train, rollout_tp=2, rollout_dp=8) == [
        "world",
        "megatron TP",
        "megatron PP",
        "megatron DP",
        "megatron EP",
        "megatron expert-DP",
        "megatron embedding",
        "vLLM TP",
        "vLLM DP",
        "vLLM EP",
    ]
    single = Layout(world=1, tp=1, pp=1, cp=1, ep=1, etp=1)
    assert hccl_communicators(single, rollout_tp=1, rollout_dp=1) == []
