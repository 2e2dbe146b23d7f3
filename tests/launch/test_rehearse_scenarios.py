"""The rehearsal's one runner (r1_ascend.rehearse.scenarios) without a cluster: every scenario is set up, started,
driven, stopped and judged in that order; a scenario that fails while driving still stops everything it started and
is not judged; the command's arguments name the scenario, its plan and its summary file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from r1_ascend.rehearse import scenarios
from r1_ascend.rehearse.config import Plan
from r1_ascend.rehearse.faults import FAULTS, MOE_FAULTS, PROCESS_FAULTS
from r1_ascend.rehearse.rollout_faults import FAULTS as ROLLOUT_FAULTS
from r1_ascend.rehearse.session import Session


class Recorder:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[str] = []
        monkeypatch.setattr(scenarios, "start_cluster", lambda cluster, log: self.calls.append("start") or "head")
        monkeypatch.setattr(scenarios, "stop_cluster", lambda cluster: self.calls.append("stop"))
        monkeypatch.setattr(scenarios, "log_progress", lambda line: self.calls.append(f"say {line}"))

    def setup(self, out: Path, plan: Plan, weights: Path | None, sampler: Any) -> Session:
        self.calls.append(f"setup {plan.total_steps}")
        return Session(out, plan, out / "launch.sh", cluster=None, logs=[out / "run1.log"], context={"n": 7})  # type: ignore[arg-type]

    def scenario(self, drive: Any) -> scenarios.Scenario:
        return scenarios.Scenario(
            "v",
            drive,
            lambda session, evidence: self.calls.append(f"judge {evidence}") or {"evidence": evidence},
            print,
            announce="log {log} n={n} steps={plan.total_steps}",
            plan=lambda base: Plan(total_steps=base.total_steps + 1),
            setup=self.setup,
        )


def test_the_runner_sets_up_starts_drives_stops_then_judges(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    recorder = Recorder(monkeypatch)

    def drive(session: Session) -> str:
        assert session.driver == "head"
        recorder.calls.append("drive")
        return "evidence"

    summary = scenarios.run_scenario(recorder.scenario(drive), tmp_path, Plan(total_steps=4), None, None)  # type: ignore[arg-type]
    assert summary == {"evidence": "evidence"}
    assert recorder.calls == [
        "setup 5",
        "start",
        f"say log {tmp_path / 'run1.log'} n=7 steps=5",
        "drive",
        "say stopping the drivers and the Ray nodes (recorded pids)",
        "stop",
        "judge evidence",
    ]


@pytest.mark.parametrize("error", [RuntimeError("planted"), KeyboardInterrupt()])
def test_a_scenario_that_fails_while_driving_is_stopped_and_not_judged(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, error: BaseException
) -> None:
    recorder = Recorder(monkeypatch)

    def drive(_session: Session) -> None:
        raise error

    with pytest.raises(type(error)):
        scenarios.run_scenario(recorder.scenario(drive), tmp_path, Plan(), None, None)  # type: ignore[arg-type]
    assert recorder.calls[-1] == "stop"
    assert not any(call.startswith("judge") for call in recorder.calls)


def test_a_cluster_that_fails_to_start_is_stopped(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    recorder = Recorder(monkeypatch)

    def failing_start(cluster: Any, log: Path) -> None:
        raise RuntimeError("the head did not start")

    monkeypatch.setattr(scenarios, "start_cluster", failing_start)
    with pytest.raises(RuntimeError, match="the head did not start"):
        scenarios.run_scenario(recorder.scenario(lambda s: None), tmp_path, Plan(), None, None)  # type: ignore[arg-type]
    assert recorder.calls[-1] == "stop"


@pytest.mark.parametrize("name", [*FAULTS, *PROCESS_FAULTS, *MOE_FAULTS])
def test_every_fault_names_a_scenario_with_its_own_plan_and_summary_file(name: str) -> None:
    scenario = scenarios.scenario_for(fault=name, rollout_fault=None, resume_with=None)
    plan = scenario.plan(Plan())
    assert scenario.variant == name
    assert plan.total_steps < Plan().total_steps, "a fault runs a shorter plan"
    assert plan.min_reward_rise is None, "a fault run does not judge learning"
    assert name in scenario.announce


@pytest.mark.parametrize("name", sorted(n for n, f in ROLLOUT_FAULTS.items() if not f.persistent))
def test_every_rollout_fault_plants_itself_in_its_plan(name: str) -> None:
    """A weight or sampling fault in a weight sync; a fault of the engine's configuration in the engine it builds."""
    scenario = scenarios.scenario_for(fault=None, rollout_fault=name, resume_with=None)
    plan = scenario.plan(Plan())
    assert scenario.variant == name
    if ROLLOUT_FAULTS[name].engine_overrides is not None:
        assert (plan.engine_fault, plan.rollout_fault) == (name, None)
        assert f"{name} in the engine's hf_overrides" in scenario.announce.format(log="x", plan=plan)
        return
    assert plan.engine_fault is None
    assert plan.rollout_fault is not None
    assert plan.rollout_fault.startswith(f"{name}@")
    assert plan.rollout_fault in scenario.announce.format(log="x", plan=plan)


def test_no_fault_is_the_plain_run_and_resume_takes_its_overrides(tmp_path: Path) -> None:
    assert scenarios.scenario_for(fault=None, rollout_fault=None, resume_with=None) is scenarios.PLAIN
    assert scenarios.PLAIN.variant is None
    assert scenarios.PLAIN.plan(Plan()) == Plan()
    resume = scenarios.scenario_for(fault="hang", rollout_fault=None, resume_with=["a=b"])
    assert resume.variant == "resume"
    with pytest.raises(Exception, match="holds no rehearsal to resume"):
        resume.setup(tmp_path, Plan(), None, None)  # type: ignore[arg-type]
