"""Checks on what the rehearsal's workers recorded: rollout lifecycle order and the overlay prelude's summary."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from r1_ascend.patches import DpEpConfigError
from r1_ascend.patches.rules.dp_layout import plan_dp_ep_layout

T = TypeVar("T")

#: What verl's ActorRolloutRefWorker must do around every generation (rollout_mode, generate, trainer_mode).
CYCLE = ("resume(weights)", "update_weights", "resume(kv_cache)", "generate", "release")
LIFECYCLE_EVENTS = {"release", "resume(weights)", "update_weights", "resume(kv_cache)", "generate"}
#: Patches every worker's prelude must have applied for the rehearsal to exercise the overlay.
REQUIRED_PATCHES = ("vllm_rollout_offload", "vllm_engine_kv_cache_configs", "verl_onpolicy_logprob")
#: The patch that must have replaced vLLM's ``Sampler.forward`` in every generation (temperature-scaled log-probs).
SAMPLER_PATCH = "verl_rollout_guard"
#: The class every weight sync must go through (``load_weights``): the one vLLM's registry resolves for DeepSeek-V3
#: once vllm-ascend registers its models, as on the cluster (r1_ascend.cpu.vllm_deepseek).
VLLM_LOADER = "vllm_ascend.models.deepseek_v2.CustomDeepseekV3ForCausalLM"
PRELUDE_LINE = re.compile(r"r1-ascend overlay \(pid (\d+)\): applied=(\S+) already=(\S+)")


class LifecycleError(AssertionError):
    """A worker's record breaks the expected order, or a worker's prelude did not apply the overlay."""


def read_lifecycle(directory: Path) -> list[dict[str, Any]]:
    events = []
    for path in sorted(directory.glob("lifecycle-*.log")):
        for line in path.read_text().splitlines():
            if line.strip():
                events.append(json.loads(line))
    return sorted(events, key=lambda e: e["t"])


#: The rollout methods the stand-ins record (``resume`` with its tags); any other recorded call of them is unknown.
LIFECYCLE_METHODS = ("release", "resume", "update_weights", "generate")


def _by_pid(events: list[dict[str, Any]]) -> dict[int, list[str]]:
    """Each worker's rollout lifecycle calls in time order (bookkeeping events such as ``load_checkpoint`` left out).

    A recorded rollout call that is not one of :data:`LIFECYCLE_EVENTS` (``resume`` with other tags, say) fails."""
    sequences: dict[int, list[str]] = {}
    for event in sorted(events, key=lambda e: e["t"]):
        name = event["event"]
        if name in LIFECYCLE_EVENTS:
            sequences.setdefault(int(event["pid"]), []).append(name)
        elif name.split("(", 1)[0] in LIFECYCLE_METHODS:
            raise LifecycleError(
                f"worker pid {event['pid']} recorded {name!r}, expected one of {', '.join(sorted(LIFECYCLE_EVENTS))}"
            )
    return sequences


def check_sequence(sequence: list[str], *, complete: bool) -> int:
    """Number of generations in a worker's sequence: release first (the build), then whole cycles.

    A worker of a killed run may stop anywhere inside a cycle (``complete=False``)."""
    if not sequence or sequence[0] != "release":
        raise LifecycleError(f"the rollout must be released right after it is built; got {sequence[:3]}")
    body = sequence[1:]
    for index, event in enumerate(body):
        if event != CYCLE[index % len(CYCLE)]:
            raise LifecycleError(
                f"event {index + 1} after the first release is {event!r}, expected {CYCLE[index % len(CYCLE)]!r}; "
                f"sequence: {', '.join(sequence)}"
            )
    if complete and len(body) % len(CYCLE):
        raise LifecycleError(f"the sequence stops inside a cycle: {', '.join(sequence)}")
    return body.count("generate")


def check_lifecycle(events: list[dict[str, Any]], killed_pids: set[int], workers_per_run: int | None = None) -> str:
    """Check every worker (those of the killed run may end mid-cycle); return a one-line description.

    ``killed_pids``: the processes that had recorded anything when the driver was killed. With ``workers_per_run``,
    each run (killed, resumed) must have exactly that many rollout workers, which fails a lost worker and a
    ``killed_pids`` naming every worker (that would excuse them all from ending on a whole cycle). The resumed run's
    workers must all have generated the same number of times."""
    sequences = _by_pid(events)
    if not sequences:
        raise LifecycleError("no worker recorded a rollout lifecycle event")
    if workers_per_run is not None:
        killed = sorted(pid for pid in sequences if pid in killed_pids)
        resumed = sorted(pid for pid in sequences if pid not in killed_pids)
        if len(killed) != workers_per_run or len(resumed) != workers_per_run:
            raise LifecycleError(
                f"expected {workers_per_run} rollout workers in each run, found {len(killed)} in the killed run "
                f"(pids {killed}) and {len(resumed)} in the resumed run (pids {resumed})"
            )
    counts: dict[int, int] = {}
    for pid, sequence in sequences.items():
        complete = pid not in killed_pids
        try:
            counts[pid] = check_sequence(sequence, complete=complete)
        except LifecycleError as exc:
            run = "resumed run, must end after a whole cycle" if complete else "killed run"
            raise LifecycleError(f"worker pid {pid} ({run}): {exc}") from None
    finished = {pid: n for pid, n in sorted(counts.items()) if pid not in killed_pids}
    if len(set(finished.values())) > 1:
        raise LifecycleError(
            f"the workers of the resumed run generated different numbers of times (pid: generations {finished}); "
            f"every worker takes part in every generation, so one stopped early"
        )
    generations = sum(counts.values())
    return (
        f"{len(sequences)} workers, {generations} generations, each as "
        f"release -> resume(weights) -> update_weights -> resume(kv_cache) -> generate"
    )


def check_checkpoint_loads(events: list[dict[str, Any]], killed_pids: set[int], step: int) -> str:
    """Every worker of the resumed run loaded the actor checkpoint of ``step`` once, before its first generation
    (none when ``step`` is 0: nothing was saved before the kill); no worker of the killed run (a fresh start) loaded
    one."""
    workers = _by_pid(events)
    loads: dict[int, list[str]] = {pid: [] for pid in workers}
    generated: set[int] = set()
    for event in sorted(events, key=lambda e: e["t"]):
        pid = int(event["pid"])
        if pid not in workers:
            continue
        if event["event"] == "generate":
            generated.add(pid)
        elif event["event"] == "load_checkpoint":
            loads[pid].append(f"step {event.get('step')}" + (" after a generation" if pid in generated else ""))
    resumed = sorted(pid for pid in workers if pid not in killed_pids)
    if not resumed:
        raise LifecycleError("no worker of the resumed run recorded a rollout lifecycle event")
    for pid in sorted(workers):
        expected = [] if pid in killed_pids or step == 0 else [f"step {step}"]
        if loads[pid] != expected:
            run = "killed run, started fresh" if pid in killed_pids else "resumed run"
            raise LifecycleError(
                f"worker pid {pid} ({run}) loaded checkpoints [{', '.join(loads[pid]) or 'none'}], expected "
                f"[{', '.join(expected) or 'none'}] before its first generation"
            )
    if step == 0:
        return f"{len(resumed)} workers of the resumed run started afresh (no checkpoint was saved before)"
    return f"{len(resumed)} workers of the resumed run loaded global_step_{step} before generating"


def check_preludes(log_texts: list[str], events: list[dict[str, Any]]) -> str:
    """Every worker that ran the rollout logged the prelude's summary with the required patches applied."""
    applied: dict[int, set[str]] = {}
    for text in log_texts:
        for pid, done, already in PRELUDE_LINE.findall(text):
            applied.setdefault(int(pid), set()).update(n for n in f"{done},{already}".split(",") if n != "none")
    workers = sorted(_by_pid(events))
    if not workers:
        raise LifecycleError("no worker recorded a rollout lifecycle event, so no prelude line can be matched to one")
    for pid in workers:
        if pid not in applied:
            raise LifecycleError(
                f"worker pid {pid} logged no 'r1-ascend overlay (pid {pid}): applied=...' prelude line "
                f"(lines found for pids {sorted(applied)})"
            )
        missing = [name for name in REQUIRED_PATCHES if name not in applied[pid]]
        if missing:
            raise LifecycleError(f"worker pid {pid}'s prelude did not apply {', '.join(missing)}")
    return f"{len(workers)} workers logged the prelude with {', '.join(REQUIRED_PATCHES)} applied"


def check_sampling(events: list[dict[str, Any]], killed_pids: set[int]) -> str:
    """Every generation of every worker sampled through vLLM's ``Sampler.forward`` as the overlay replaced it.

    Each ``generate`` record must be followed, before the worker's next rollout call, by a ``sampled`` record with
    at least one call, all by :data:`SAMPLER_PATCH`. A worker of the killed run may lack it after its last
    generation (killed during it)."""
    pending: dict[int, bool] = {}
    generations = calls = 0
    for event in sorted(events, key=lambda e: e["t"]):
        pid, name = int(event["pid"]), event["event"]
        if name == "sampled":
            if not pending.pop(pid, False):
                raise LifecycleError(f"worker pid {pid} recorded sampling with no generation before it")
            if event.get("calls", 0) < 1 or event.get("patched_by") != [SAMPLER_PATCH]:
                raise LifecycleError(
                    f"worker pid {pid} generated with vLLM's Sampler.forward called {event.get('calls')} times by "
                    f"{event.get('patched_by')}, expected at least once and only as patch {SAMPLER_PATCH!r} replaced "
                    f"it (without it the rollout's log-probs are those of the logits before temperature)"
                )
            generations, calls = generations + 1, calls + int(event["calls"])
        elif name in LIFECYCLE_EVENTS:
            if pending.get(pid):
                raise LifecycleError(f"worker pid {pid}: a generation recorded no sampling before its {name!r}")
            pending[pid] = name == "generate"
    unfinished = sorted(pid for pid, waiting in pending.items() if waiting and pid not in killed_pids)
    if unfinished:
        raise LifecycleError(f"workers {unfinished} recorded a last generation without its sampling")
    if not generations:
        raise LifecycleError("no worker recorded how a generation sampled")
    return f"{generations} generations sampled by vLLM's Sampler.forward as {SAMPLER_PATCH} replaced it ({calls} calls)"


def check_loading(events: list[dict[str, Any]], killed_pids: set[int]) -> str:
    """Every weight sync of every worker went through :data:`VLLM_LOADER`'s ``load_weights``.

    Each ``update_weights`` record must be followed, before the worker's next sync, by a ``loaded`` record naming
    that class and counting every sync of the worker so far. A worker of the killed run may lack it after its last
    sync (killed during it)."""
    syncs: dict[int, int] = {}
    pending: set[int] = set()
    for event in sorted(events, key=lambda e: e["t"]):
        pid, name = int(event["pid"]), event["event"]
        if name == "update_weights":
            if pid in pending:
                raise LifecycleError(f"worker pid {pid}: weight sync {syncs[pid]} recorded no load before the next")
            pending.add(pid)
            syncs[pid] = syncs.get(pid, 0) + 1
        elif name == "loaded":
            if pid not in pending:
                raise LifecycleError(f"worker pid {pid} recorded a weight load with no sync before it")
            pending.discard(pid)
            if event.get("model") != VLLM_LOADER or event.get("loads") != syncs[pid]:
                raise LifecycleError(
                    f"worker pid {pid}: weight sync {syncs[pid]} left {event.get('loads')} loads by "
                    f"{event.get('model')}, expected every sync through {VLLM_LOADER}.load_weights (the rollout "
                    f"model vLLM builds on the cluster; R1_ASCEND_ROLLOUT_VLLM_LOADER=0 bypasses it)"
                )
    unfinished = sorted(pid for pid in pending if pid not in killed_pids)
    if unfinished:
        raise LifecycleError(f"workers {unfinished} recorded a last weight sync without its load")
    if not syncs:
        raise LifecycleError("no worker recorded a weight sync")
    return f"{sum(syncs.values())} weight syncs through {VLLM_LOADER}.load_weights"


def check_weight_checks(events: list[dict[str, Any]], killed_pids: set[int]) -> str:
    """Every weight sync of every worker was checked exactly by the weight-sync check (patch
    ``verl_weight_sync_check``) and matched: each ``update_weights`` record is followed, before the worker's next
    sync, by a ``weight_checked`` record of that sync number with no mismatch. A worker of the killed run may lack it
    after its last sync. Returns how many, and what the check cost against the whole sync (verl's ``rollout_mode``)."""
    syncs: dict[int, int] = {}
    pending: set[int] = set()
    check_s = sync_s = 0.0
    for event in sorted(events, key=lambda e: e["t"]):
        pid, name = int(event["pid"]), event["event"]
        if name == "update_weights":
            if pid in pending:
                raise LifecycleError(
                    f"worker pid {pid}: weight sync {syncs[pid]} was not checked by the weight-sync check before the "
                    "next (R1_ASCEND_DISABLE must not name verl_weight_sync_check in a rehearsal)"
                )
            pending.add(pid)
            syncs[pid] = syncs.get(pid, 0) + 1
        elif name == "weight_checked" and pid in pending:
            pending.discard(pid)
            if int(event["sync"]) != syncs[pid] or int(event["mismatches"]):
                raise LifecycleError(
                    f"worker pid {pid}: weight sync {syncs[pid]} was checked as sync {event['sync']} with "
                    f"{event['mismatches']} mismatches (first: {event.get('first')})"
                )
            check_s += float(event["predict_s"]) + float(event["receive_s"]) + float(event["verify_s"])
            sync_s += float(event["sync_s"] or 0.0) + float(event["verify_s"])
    unfinished = sorted(pid for pid in pending if pid not in killed_pids)
    if unfinished:
        raise LifecycleError(
            f"workers {unfinished} recorded a last weight sync the weight-sync check did not check (R1_ASCEND_DISABLE "
            "must not name verl_weight_sync_check in a rehearsal)"
        )
    if not syncs:
        raise LifecycleError("no worker recorded a weight sync")
    share = f"{100 * check_s / sync_s:.1f} %" if sync_s else "n/a"
    return (
        f"{sum(syncs.values())} weight syncs checked exactly, every engine tensor and share matching "
        f"(the check {check_s:.2f} s of {sync_s:.2f} s of syncs, {share})"
    )


def check_vllm_groups(events: list[dict[str, Any]]) -> str:
    """Every worker that generated recorded vLLM's TP, DP and EP groups once its engine was built, and they are the
    ranks the overlay's layout rule plans for its world and TP size (``r1_ascend.patches.rules.dp_layout``): with
    rollout DP > 1 the overlay's ``vllm_dp_ep_groups`` built them, at DP 1 vLLM's own start-up did."""
    groups = {int(e["pid"]): e for e in events if e["event"] == "vllm_groups"}
    missing = sorted({int(e["pid"]) for e in events if e["event"] == "generate"} - set(groups))
    if missing:
        raise LifecycleError(f"worker pids {missing} generated with no record of vLLM's TP / DP / EP groups")
    if not groups:
        raise LifecycleError("no worker recorded vLLM's TP / DP / EP groups")
    layouts = set()
    for pid, event in sorted(groups.items()):
        found = (tuple(event["tp"]), tuple(event["dp"]), tuple(event["ep"]))
        try:
            plan = plan_dp_ep_layout(len(event["ep"]), int(event["rank"]), len(event["tp"]))
        except DpEpConfigError as exc:
            raise LifecycleError(f"worker pid {pid} recorded vLLM groups no layout has: {exc}") from exc
        expected = (plan.tp_group, plan.dp_group, plan.ep_group)
        if found != expected:
            raise LifecycleError(
                f"worker pid {pid} (rank {event['rank']}) built vLLM's groups TP {list(found[0])}, DP "
                f"{list(found[1])}, EP {list(found[2])}; the layout of {plan.world_size} ranks at TP {plan.tp_size} "
                f"is TP {list(expected[0])}, DP {list(expected[1])}, EP {list(expected[2])}"
            )
        layouts.add((plan.tp_size, plan.dp_size, plan.ep_size))
    shape = ", ".join(f"TP {tp} x DP {dp}, EP {ep}" for tp, dp, ep in sorted(layouts))
    return f"{len(groups)} workers built vLLM's groups as the DP/EP layout plans them ({shape})"


def rollout_path(events: list[dict[str, Any]], killed_pids: set[int]) -> dict[str, str]:
    """The rollout ran vLLM's own pieces in every worker: its sampler on every generation
    (:func:`check_sampling`), its DeepSeek-V3 ``load_weights`` on every sync (:func:`check_loading`), over the TP,
    DP and EP groups the layout plans (:func:`check_vllm_groups`), and every sync was checked exactly
    (:func:`check_weight_checks`)."""
    return {
        "sampling": check_sampling(events, killed_pids),
        "weight_loading": check_loading(events, killed_pids),
        "weight_check": check_weight_checks(events, killed_pids),
        "vllm_groups": check_vllm_groups(events),
    }


def check_records(records: Path, check: Callable[[list[dict[str, Any]]], T]) -> T:
    """``check`` of the records in ``records``; a failure names that directory."""
    try:
        return check(read_lifecycle(records))
    except LifecycleError as exc:
        raise LifecycleError(f"{exc}; records: {records}") from exc


def check_rollout_path(records: Path, killed_pids: set[int]) -> dict[str, str]:
    """:func:`rollout_path` of the records in ``records``; a failure names that directory."""
    return check_records(records, lambda events: rollout_path(events, killed_pids))
