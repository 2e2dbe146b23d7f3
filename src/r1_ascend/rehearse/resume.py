"""``r1-ascend rehearse --resume [key=value ...]``: continue an interrupted rehearsal in its output directory.

It starts the simulated nodes afresh, runs the rehearsal's own launch script (with the given Hydra overrides, e.g.
the ``trainer.resume_from_path=...`` a refused resume printed) and checks what a relaunch on a cluster must do:
resume from the tracked checkpoint (or the one named by ``trainer.resume_from_path``), run every remaining step
once, every new worker loading that checkpoint before it generates, no metric NaN, the last checkpoint complete.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

from r1_ascend.patches.rules.checkpoints import read_tracker, step_dirs
from r1_ascend.rehearse import training
from r1_ascend.rehearse.budget import RssSampler
from r1_ascend.rehearse.cluster import PLAN_FILE, new_cluster, write_launch
from r1_ascend.rehearse.config import Plan, with_overrides
from r1_ascend.rehearse.lifecycle import (
    LifecycleError,
    check_checkpoint_loads,
    check_lifecycle,
    check_preludes,
    read_lifecycle,
    rollout_path,
)
from r1_ascend.rehearse.progress import RehearsalError, read_log
from r1_ascend.rehearse.session import Session
from r1_ascend.rehearse.verdicts import check_checkpoint, check_joined, check_resumed

_RESUME_FROM = re.compile(r"trainer\.resume_from_path=\S*global_step_(\d+)/?$")


def _launch_command(launch: Path) -> list[str]:
    line = next((x for x in read_log(launch).splitlines() if x.startswith("exec ")), None)
    if line is None:
        raise RehearsalError(f"{launch} has no 'exec ...' line: not a rehearsal's launch script")
    return shlex.split(line.removeprefix("exec "))


def expected_step(out: Path, extra: list[str]) -> int:
    """The step the relaunch must resume from: the one ``trainer.resume_from_path`` names, else the tracked one;
    0 when no checkpoint was saved at all (verl then starts afresh, which the relaunch's log must show)."""
    for item in extra:
        if match := _RESUME_FROM.match(item):
            return int(match.group(1))
    tracked = read_tracker(out / "checkpoints")
    if tracked is None and not step_dirs(out / "checkpoints"):
        return 0  # the run was stopped before its first checkpoint: the relaunch starts at step 0, and says so
    if not isinstance(tracked, int):
        raise RehearsalError(
            f"nothing to resume in {out}: {tracked or 'no latest_checkpointed_iteration.txt under checkpoints/'}"
        )
    return tracked


def setup(out: Path, extra: list[str], sampler: RssSampler) -> Session:
    """The session of the next run in ``out``: the stored plan, the launch script with ``extra`` overrides, the next
    ``run<N>.log``, and what the runner must judge against (the step to resume from, the earlier runs' workers)."""
    if not (out / PLAN_FILE).is_file() or not (out / "launch.sh").is_file():
        raise RehearsalError(f"{out} holds no rehearsal to resume ({PLAN_FILE} and launch.sh are missing)")
    stored = json.loads((out / PLAN_FILE).read_text())
    plan = Plan(**{**stored, "overrides": tuple(stored.get("overrides", ()))})
    expected = expected_step(out, extra)
    launch = write_launch(out / "launch-resume.sh", with_overrides(_launch_command(out / "launch.sh"), extra))
    index = 1 + max(
        (int(m.group(1)) for p in out.glob("run*.log") if (m := re.fullmatch(r"run(\d+)\.log", p.name))), default=0
    )
    before = {int(e["pid"]) for e in read_lifecycle(out / "lifecycle")}
    shutil.rmtree(out / "nodes", ignore_errors=True)  # the previous cluster's start logs would read as this one's
    cluster = new_cluster(out, plan, launch, sampler)
    context = {"expected": expected, "index": index, "before": before}
    return Session(out, plan, launch, cluster, [out / f"run{index}.log"], context=context)


def drive(session: Session) -> int:
    """Let the relaunched run finish: its exit code."""
    try:
        return session.driver.wait(900)
    except subprocess.TimeoutExpired:
        raise RehearsalError(f"the resumed run did not finish within 900 s; log: {session.logs[0]}") from None


def judge(session: Session, code: int) -> dict[str, object]:
    out, plan, log = session.out, session.plan, session.logs[0]
    expected, index, before = (session.context[k] for k in ("expected", "index", "before"))
    if code != 0:
        raise RehearsalError(f"the resumed run failed with exit code {code}; log: {log}")
    text = read_log(log)
    joined, npus = check_joined(text, plan, log)
    steps = check_resumed(text, log, plan, expected, "the tracked checkpoint or trainer.resume_from_path")
    events = [e for e in read_lifecycle(out / "lifecycle") if int(e["pid"]) not in before]
    try:
        lifecycle = check_lifecycle(events, set(), workers_per_run=None)
        if len({int(e["pid"]) for e in events if e["event"] == "release"}) != plan.world:
            raise LifecycleError(f"expected {plan.world} rollout workers in the resumed run; records: {out}")
        loads = check_checkpoint_loads(events, set(), expected)
        preludes = check_preludes([text], events)
        rollout = rollout_path(events, set())
    except LifecycleError as exc:
        raise LifecycleError(f"{exc}; records: {out / 'lifecycle'}, log: {log}") from exc
    training.check_finite(training.step_metrics([log]), [log])
    check_checkpoint(out / "checkpoints", plan.total_steps, plan.world)
    return {
        "nodes_joined": joined,
        "npus_seen": npus,
        "resumed_from_step": expected,
        "steps_run": {f"run {index} (resumed)": steps},
        "lifecycle": lifecycle,
        "checkpoint_loads": loads,
        "preludes": preludes,
        **rollout,
        "ray_temp_dir": session.cluster.temp_dir,
        "netns": session.cluster.netns,
    }
