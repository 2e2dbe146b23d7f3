"""The rehearsal's verdicts (r1_ascend.rehearse.verdicts check_*, r1_ascend.rehearse.lifecycle) at the edges of their
rules, on small synthetic logs and lifecycle records: a run 1 with a gap in its steps, a kill with nothing saved
before it, a run 1 that reached the killed step, a cluster with the right nodes but the wrong NPU count.

``test_rehearse_verdicts.py`` judges a real rehearsal's records with one fault planted at a time; these cases are
the ones that record cannot express (its run 1 was killed in step 3 after a checkpoint at step 2).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from r1_ascend.rehearse import lifecycle, verdicts
from r1_ascend.rehearse.config import Plan
from r1_ascend.rehearse.lifecycle import CYCLE, LifecycleError
from r1_ascend.rehearse.progress import RehearsalError

pytestmark = pytest.mark.machine

PLAN = Plan(total_steps=6, save_freq=2, test_freq=2, prompts_per_step=4, samples_per_prompt=2, response_length=24)
LOGS = [Path("run1.log"), Path("run2.log")]


def log(*steps: int, resumed_from: int | None = None) -> str:
    """A driver log as verl writes it: the checkpoint it loaded (if any), then one metrics line per step."""
    lines = [f"Load from checkpoint folder: /out/checkpoints/global_step_{resumed_from}\n"] if resumed_from else []
    lines += [
        f"(TaskRunner pid=7) step:{step} - critic/score/mean:0.5 - training/global_step:{step}\n" for step in steps
    ]
    return "".join(lines)


# --- run 1 started fresh and was killed in the step after its checkpoint ---------------------------------------


def test_run_1_from_step_1_up_to_the_kill_passes() -> None:
    steps, resumed = verdicts.check_resume([log(1, 2, 3, 4), log(5, 6, resumed_from=4)], LOGS, PLAN, killed_step=5)
    assert steps == [[1, 2, 3, 4], [5, 6]]
    assert resumed == 4


@pytest.mark.parametrize("logged", [(1, 2, 4), (1, 3, 4), (2, 3, 4), ()], ids=["gap", "gap-early", "late", "none"])
def test_run_1_must_log_every_step_from_1(logged: tuple[int, ...]) -> None:
    """A gap means verl skipped or lost a step; a late first step means run 1 did not start fresh."""
    with pytest.raises(RehearsalError, match=rf"run 1 logged steps \[{', '.join(map(str, logged))}\], expected 1, 2"):
        verdicts.check_resume([log(*logged), log(5, 6, resumed_from=4)], LOGS, PLAN, killed_step=5)


def test_run_1_must_not_finish_the_killed_step() -> None:
    with pytest.raises(RehearsalError, match="run 1 finished step 5, it was meant to be killed in it"):
        verdicts.check_resume([log(1, 2, 3, 4, 5), log(5, 6, resumed_from=4)], LOGS, PLAN, killed_step=5)


def test_run_2_resumes_from_the_last_complete_checkpoint_when_told() -> None:
    """``expected_from``: a fault run whose newest checkpoint was broken resumes from an older one."""
    _, resumed = verdicts.check_resume(
        [log(1, 2, 3, 4), log(3, 4, 5, 6, resumed_from=2)], LOGS, PLAN, killed_step=5, expected_from=2
    )
    assert resumed == 2
    with pytest.raises(RehearsalError, match="resumed from global_step_2, expected global_step_4"):
        verdicts.check_resume([log(1, 2, 3, 4), log(3, 4, 5, 6, resumed_from=2)], LOGS, PLAN, killed_step=5)


# --- the relaunch ----------------------------------------------------------------------------------------------


def test_a_relaunch_with_nothing_saved_starts_at_step_1() -> None:
    """expected 0: no checkpoint was saved before the kill, so the relaunch loads none and runs every step."""
    assert verdicts.check_resumed(log(1, 2, 3, 4, 5, 6), LOGS[1], PLAN, 0, "nothing saved") == [1, 2, 3, 4, 5, 6]


def test_a_relaunch_with_nothing_saved_must_not_load_a_checkpoint() -> None:
    with pytest.raises(RehearsalError, match="resumed from global_step_2, but no checkpoint was saved before"):
        verdicts.check_resumed(log(3, 4, 5, 6, resumed_from=2), LOGS[1], PLAN, 0, "nothing saved")


def test_the_last_load_line_is_the_one_that_counts() -> None:
    """verl prints a load line per role; the checkpoint is the one named last."""
    text = log(resumed_from=2) + log(5, 6, resumed_from=4)
    assert verdicts.check_resumed(text, LOGS[1], PLAN, 4, "why") == [5, 6]


@pytest.mark.parametrize("logged", [(5,), (5, 6, 7), (6,), (4, 5, 6)])
def test_the_relaunch_runs_exactly_the_remaining_steps(logged: tuple[int, ...]) -> None:
    with pytest.raises(RehearsalError, match=r"expected \[5, 6\]"):
        verdicts.check_resumed(log(*logged, resumed_from=4), LOGS[1], PLAN, 4, "why")


# --- the cluster -----------------------------------------------------------------------------------------------


def ready(nodes: str, total: str) -> str:
    return f"[ray_start_npu] ray cluster ready: {nodes}; NPU total {total}\n"


def test_every_node_with_its_npus_joins() -> None:
    plan = Plan(nodes=2, npus_per_node=2)
    line = ready("127.0.0.3 (2 NPU), 127.0.0.2 (2 NPU)", "4.0")
    assert verdicts.check_joined(line, plan, LOGS[0]) == ("127.0.0.3 (2 NPU), 127.0.0.2 (2 NPU)", 4.0)


@pytest.mark.parametrize(
    ("nodes", "total"),
    [
        ("127.0.0.2 (2 NPU), 127.0.0.3 (2 NPU)", "3.0"),  # a die missing from the total
        ("127.0.0.2 (2 NPU), 127.0.0.3 (1 NPU)", "4.0"),  # one node short of a die
        ("127.0.0.2 (2 NPU), 127.0.0.4 (2 NPU)", "4.0"),  # a stranger instead of node 1
        ("127.0.0.2 (2 NPU)", "4.0"),
    ],
)
def test_a_cluster_that_differs_from_the_plan_fails(nodes: str, total: str) -> None:
    with pytest.raises(RehearsalError, match="the cluster that joined is"):
        verdicts.check_joined(ready(nodes, total), Plan(nodes=2, npus_per_node=2), LOGS[0])


# --- checkpoint loads when nothing was saved before the kill ---------------------------------------------------


def records(pid: int, *events: str, t0: float = 0.0, step: int = 2) -> list[dict[str, object]]:
    fields = {"load_checkpoint": {"step": step}, "generate": {"validate": False}}
    return [{"t": t0 + i, "pid": pid, "event": e, **fields.get(e, {})} for i, e in enumerate(events)]


KILLED = records(11, "release", *CYCLE)
FRESH = records(21, "release", *CYCLE, *CYCLE, t0=100) + records(22, "release", *CYCLE, *CYCLE, t0=100)


def test_nothing_saved_before_the_kill_means_no_worker_loads() -> None:
    text = lifecycle.check_checkpoint_loads(KILLED + FRESH, {11}, 0)
    assert text == "2 workers of the resumed run started afresh (no checkpoint was saved before)"


def test_nothing_saved_yet_a_resumed_worker_loaded_a_checkpoint() -> None:
    loaded = records(22, "release", "load_checkpoint", *CYCLE, t0=100)
    events = KILLED + records(21, "release", *CYCLE, t0=100) + loaded
    with pytest.raises(LifecycleError, match=r"worker pid 22 \(resumed run\) loaded checkpoints \[step 2\], expected "
                       r"\[none\]"):  # fmt: skip
        lifecycle.check_checkpoint_loads(events, {11}, 0)


def test_a_saved_step_must_be_loaded_by_every_resumed_worker() -> None:
    loaded = records(21, "release", "load_checkpoint", *CYCLE, t0=100, step=4)
    events = KILLED + loaded + records(22, "release", "load_checkpoint", *CYCLE, t0=100, step=4)
    assert lifecycle.check_checkpoint_loads(events, {11}, 4).endswith("loaded global_step_4 before generating")
    with pytest.raises(LifecycleError, match=r"worker pid 22 \(resumed run\) loaded checkpoints \[none\]"):
        lifecycle.check_checkpoint_loads(KILLED + loaded + records(22, "release", *CYCLE, t0=100), {11}, 4)


def test_only_killed_workers_is_no_resumed_run() -> None:
    with pytest.raises(LifecycleError, match="no worker of the resumed run"):
        lifecycle.check_checkpoint_loads(KILLED, {11}, 0)


def test_records_of_processes_without_a_rollout_are_not_workers() -> None:
    """The TaskRunner records a load too (verl's trainer loads data.pt); it is not a rollout worker."""
    runner = records(5, "load_checkpoint", t0=99)
    assert lifecycle.check_checkpoint_loads(KILLED + FRESH + runner, {11}, 0).startswith("2 workers")


# --- lifecycle order -------------------------------------------------------------------------------------------


def test_a_killed_worker_may_stop_anywhere_in_a_cycle() -> None:
    for cut in range(1, len(CYCLE) + 1):
        assert lifecycle.check_sequence(["release", *CYCLE[:cut]], complete=False) == CYCLE[:cut].count("generate")


def test_a_finished_worker_ends_on_a_whole_cycle() -> None:
    assert lifecycle.check_sequence(["release", *CYCLE, *CYCLE], complete=True) == 2
    assert lifecycle.check_sequence(["release"], complete=True) == 0
    with pytest.raises(LifecycleError, match="stops inside a cycle"):
        lifecycle.check_sequence(["release", *CYCLE, *CYCLE[:-1]], complete=True)


def test_the_runs_must_have_as_many_workers_as_the_plan() -> None:
    events = KILLED + records(12, "release", *CYCLE) + FRESH
    assert lifecycle.check_lifecycle(events, {11, 12}, workers_per_run=2).startswith("4 workers, 6 generations")
    with pytest.raises(LifecycleError, match="expected 3 rollout workers in each run"):
        lifecycle.check_lifecycle(events, {11, 12}, workers_per_run=3)
