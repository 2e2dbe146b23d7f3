"""The learning controls: the same rehearsal with the updates off (``--lr 0``) or with each training batch's
rewards permuted (``--shuffle-rewards``, :mod:`r1_ascend.rehearse.reward_shuffle`). Either must leave the reward at
its base rate; a control that learns means the rise of the plain rehearsal is not the reward's doing.

A control is one launch of the plain plan with nothing killed: killing, resuming and exporting are the plain
rehearsal's proofs and add nothing to this one.
"""

from __future__ import annotations

import subprocess

from r1_ascend.rehearse import training
from r1_ascend.rehearse.lifecycle import check_rollout_path
from r1_ascend.rehearse.progress import RehearsalError, read_log
from r1_ascend.rehearse.session import Session
from r1_ascend.rehearse.verdicts import check_joined, judge_training

#: Seconds the control's run may take (a 10-step rehearsal launch takes 3-5 minutes on 2 cores).
RUN_BOUND_S = 1500.0


def drive(session: Session) -> int:
    """Let the run finish: its exit code."""
    try:
        return session.driver.wait(RUN_BOUND_S)
    except subprocess.TimeoutExpired:
        raise RehearsalError(f"the control run did not end within {RUN_BOUND_S:g} s; log: {session.logs[0]}") from None


def judge(session: Session, code: int, control: str) -> dict[str, object]:
    """The run ended cleanly on the plan's steps, trained the DeepSeek-V3 model as the plain rehearsal does, and its
    reward stayed flat."""
    out, plan, log = session.out, session.plan, session.logs[0]
    if code != 0:
        raise RehearsalError(f"the control run ({control}) failed with exit code {code}; log: {log}")
    joined, npus = check_joined(read_log(log), plan, log)
    summary = judge_training(out, [log], plan)
    summary.update(check_rollout_path(out / "lifecycle", set()))
    curve = training.reward_curve(training.step_metrics([log]))
    steps = sorted(curve.rewards)
    if steps != list(range(1, plan.total_steps + 1)):
        raise RehearsalError(f"the control run logged steps {steps}, expected 1..{plan.total_steps}; log: {log}")
    training.check_flat(curve, control)
    return {
        "control": {"name": control, "verdict": "did not learn"},
        "nodes_joined": joined,
        "npus_seen": npus,
        **summary,
    }
