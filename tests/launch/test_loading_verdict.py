"""The rehearsal's verdict that every weight sync of every worker went through vLLM's DeepSeek-V3 ``load_weights``
(``lifecycle.check_loading``), fed recorded event sequences."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from r1_ascend.rehearse.lifecycle import (
    CYCLE,
    SAMPLER_PATCH,
    VLLM_LOADER,
    LifecycleError,
    check_loading,
    check_rollout_path,
    check_sampling,
    check_vllm_groups,
    check_weight_checks,
)


def run(workers: int, syncs: int) -> list[dict[str, Any]]:
    """Records of ``workers`` workers each syncing ``syncs`` times, every sync loaded through vLLM's class."""
    events, t = [], 0.0
    for sync in range(1, syncs + 1):
        for pid in range(100, 100 + workers):
            events.append({"t": t, "pid": pid, "event": "update_weights"})
            events.append({"t": t + 0.5, "pid": pid, "event": "loaded", "model": VLLM_LOADER, "loads": sync})
            t += 1.0
    return events


@given(st.integers(1, 4), st.integers(1, 6))
def test_every_sync_loaded_through_vllm_passes(workers: int, syncs: int) -> None:
    verdict = check_loading(run(workers, syncs), set())
    assert verdict == f"{workers * syncs} weight syncs through {VLLM_LOADER}.load_weights"


@given(st.integers(1, 4), st.integers(1, 6), st.data())
def test_a_dropped_load_record_fails_unless_its_worker_was_killed(workers: int, syncs: int, data: Any) -> None:
    events = run(workers, syncs)
    loads = [i for i, e in enumerate(events) if e["event"] == "loaded"]
    dropped = data.draw(st.sampled_from(loads))
    pid = events[dropped]["pid"]
    last_of_worker = dropped == max(i for i in loads if events[i]["pid"] == pid)
    del events[dropped]
    if last_of_worker:
        assert check_loading(events, {pid})
    with pytest.raises(LifecycleError, match=f"{pid}|without its load"):
        check_loading(events, set())


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"model": None}, "expected every sync through"),
        ({"model": "vllm.model_executor.models.deepseek_v2.DeepseekV3ForCausalLM"}, "expected every sync through"),
        ({"loads": 1}, "left 1 loads"),
    ],
)
def test_a_sync_not_through_vllms_class_is_named(change: dict[str, Any], message: str) -> None:
    events = run(2, 2)
    second_load = [e for e in events if e["event"] == "loaded"][2]
    second_load.update(change)
    with pytest.raises(LifecycleError, match=message):
        check_loading(events, set())


def test_a_load_without_a_sync_and_no_sync_at_all_are_refused() -> None:
    with pytest.raises(LifecycleError, match="no sync before it"):
        check_loading([{"t": 0, "pid": 1, "event": "loaded", "model": VLLM_LOADER, "loads": 1}], set())
    with pytest.raises(LifecycleError, match="no worker recorded a weight sync"):
        check_loading([], set())


def test_the_error_names_the_class_that_loaded() -> None:
    events = run(1, 2)
    events[-1]["model"] = "somewhere.OtherModel"
    with pytest.raises(LifecycleError, match=r"left 2 loads by somewhere\.OtherModel, expected"):
        check_loading(events, set())


def test_no_sync_at_all_is_an_error() -> None:
    with pytest.raises(LifecycleError, match=r"^no worker recorded a weight sync$"):
        check_loading([], set())


def rollout_records(pids: tuple[int, ...] = (101, 102), cycles: int = 2) -> list[dict[str, Any]]:
    """Each worker's records as the rehearsal's hooks write them: whole cycles, each sync loaded through vLLM's class
    and each generation sampled through the patched sampler."""
    events: list[dict[str, Any]] = []
    t = 0.0
    world = list(range(len(pids)))
    for rank, pid in enumerate(pids):
        syncs = 0
        t += 0.01
        events.append(
            {"t": t, "pid": pid, "event": "vllm_groups", "rank": rank, "tp": world, "dp": [rank], "ep": world}
        )
        for name in ["release"] + [step for _ in range(cycles) for step in CYCLE]:
            t += 0.01
            events.append({"t": t, "pid": pid, "event": name})
            if name == "update_weights":
                syncs += 1
                t += 0.01
                events.append({"t": t, "pid": pid, "event": "loaded", "model": VLLM_LOADER, "loads": syncs})
                t += 0.01
                events.append(checked(pid, t, syncs))
            elif name == "generate":
                t += 0.01
                events.append({"t": t, "pid": pid, "event": "sampled", "calls": 8, "patched_by": [SAMPLER_PATCH]})
    return events


def checked(pid: int, t: float, sync: int, mismatches: int = 0) -> dict[str, Any]:
    """A weight_checked record as the rehearsal's listener writes it (patch verl_weight_sync_check)."""
    return {
        "t": t,
        "pid": pid,
        "event": "weight_checked",
        "sync": sync,
        "mismatches": mismatches,
        "first": "rank 0, sync 2: x -> y: not received" if mismatches else None,
        "predict_s": 0.25,
        "receive_s": 0.25,
        "verify_s": 0.5,
        "sync_s": 3.0,
    }


def write(directory: Path, events: list[dict[str, Any]]) -> Path:
    for pid in {e["pid"] for e in events}:
        lines = [json.dumps(e) for e in events if e["pid"] == pid]
        (directory / f"lifecycle-{pid}.log").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return directory


def test_the_rollout_path_holds_the_sampler_and_the_loader_verdicts(tmp_path: Path) -> None:
    verdict = check_rollout_path(write(tmp_path, rollout_records()), set())
    assert set(verdict) == {"sampling", "weight_loading", "weight_check", "vllm_groups"}
    assert verdict["weight_check"] == (
        "4 weight syncs checked exactly, every engine tensor and share matching (the check 4.00 s of 14.00 s of "
        "syncs, 28.6 %)"
    )
    assert verdict["vllm_groups"] == "2 workers built vLLM's groups as the DP/EP layout plans them (TP 2 x DP 1, EP 2)"
    assert verdict["weight_loading"] == f"4 weight syncs through {VLLM_LOADER}.load_weights"
    assert verdict["sampling"] == check_sampling(rollout_records(), set())


@pytest.mark.parametrize("dropped", ["loaded", "sampled", "weight_checked"])
def test_a_rollout_path_failure_names_the_records(tmp_path: Path, dropped: str) -> None:
    events = rollout_records()
    first = next(i for i, e in enumerate(events) if e["event"] == dropped)
    del events[first]
    with pytest.raises(LifecycleError, match=f"; records: {re.escape(str(tmp_path))}$"):
        check_rollout_path(write(tmp_path, events), set())


def test_the_rollout_path_spares_the_killed_workers_last_sync(tmp_path: Path) -> None:
    """A worker killed during a sync leaves neither that sync's load nor its generation's sampling record."""
    events = rollout_records()
    last_cycle = [i for i, e in enumerate(events) if e["pid"] == 102][-len(CYCLE) - 2 :]
    cut = next(i for i in last_cycle if events[i]["event"] == "update_weights")
    events = events[: cut + 1]
    write(tmp_path, events)
    with pytest.raises(LifecycleError, match="without its load"):
        check_rollout_path(tmp_path, set())
    assert check_rollout_path(tmp_path, {102})["weight_loading"].startswith("4 weight syncs")


def test_every_sync_must_be_checked_by_the_weight_check_and_match() -> None:
    """A sync without its weight_checked record (the check switched off), one checked as another sync, or one with
    a mismatch fails the verdict, naming the worker and the sync; a killed worker's last sync may lack it."""
    events = rollout_records()
    verdict = check_weight_checks(events, set())
    assert verdict.startswith("4 weight syncs checked exactly")
    second = [i for i, e in enumerate(events) if e["event"] == "weight_checked" and e["pid"] == 101][1]
    for change, message in (
        ({"mismatches": 3}, "weight sync 2 was checked as sync 2 with 3 mismatches"),
        ({"sync": 5}, "weight sync 2 was checked as sync 5"),
    ):
        changed = [dict(e, **change) if i == second else e for i, e in enumerate(events)]
        with pytest.raises(LifecycleError, match=message):
            check_weight_checks(changed, set())
    first = next(i for i, e in enumerate(events) if e["event"] == "weight_checked" and e["pid"] == 101)
    with pytest.raises(LifecycleError, match="weight sync 1 was not checked by the weight-sync check before the next"):
        check_weight_checks(events[:first] + events[first + 1 :], set())
    last = events[:second] + events[second + 1 :]
    last = [e for e in last if not (e["pid"] == 101 and e["t"] > events[second]["t"])]
    with pytest.raises(LifecycleError, match=r"workers \[101\] recorded a last weight sync"):
        check_weight_checks(last, set())
    assert check_weight_checks(last, {101}).startswith("4 weight syncs")
    with pytest.raises(LifecycleError, match="no worker recorded a weight sync"):
        check_weight_checks([], set())


def groups_records(world: int, tp: int, wrong: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Each rank's vLLM groups as the layout rule plans them at ``tp``; ``wrong`` replaces fields of rank 1's."""
    from r1_ascend.patches.rules.dp_layout import plan_dp_ep_layout

    events = []
    for rank in range(world):
        plan = plan_dp_ep_layout(world, rank, tp)
        event = {"t": float(rank), "pid": 100 + rank, "event": "vllm_groups", "rank": rank}
        event |= {"tp": list(plan.tp_group), "dp": list(plan.dp_group), "ep": list(plan.ep_group)}
        events.append(event | (wrong or {}) if rank == 1 else event)
        events.append({"t": float(rank) + 0.5, "pid": 100 + rank, "event": "generate"})
    return events


def test_rollout_dp_2_groups_as_planned_pass_and_are_reported() -> None:
    assert check_vllm_groups(groups_records(4, 2)) == (
        "4 workers built vLLM's groups as the DP/EP layout plans them (TP 2 x DP 2, EP 4)"
    )


@pytest.mark.parametrize(
    "wrong", [{"dp": [0, 1]}, {"tp": [1, 3]}, {"ep": [0, 1]}, {"dp": [1]}], ids=["dp", "tp", "ep", "dp-size"]
)
def test_groups_other_than_planned_name_the_rank_and_both_layouts(wrong: dict[str, Any]) -> None:
    with pytest.raises(LifecycleError, match=r"worker pid 101 \(rank 1\) built vLLM's groups TP .* the layout of"):
        check_vllm_groups(groups_records(4, 2, wrong))


def test_a_worker_that_generated_without_recording_its_groups_is_named() -> None:
    events = [e for e in groups_records(4, 2) if not (e["pid"] == 102 and e["event"] == "vllm_groups")]
    with pytest.raises(LifecycleError, match=r"worker pids \[102\] generated with no record"):
        check_vllm_groups(events)
    with pytest.raises(LifecycleError, match="no worker recorded"):
        check_vllm_groups([])


def test_groups_no_layout_can_have_are_named_not_raised_as_a_config_error() -> None:
    """An EP group of one rank with a TP group of two: the layout rule refuses it; the verdict names the worker."""
    events = groups_records(4, 2, {"ep": [1], "tp": [0, 1]})
    with pytest.raises(LifecycleError, match=r"worker pid 101 recorded vLLM groups no layout has"):
        check_vllm_groups(events)
