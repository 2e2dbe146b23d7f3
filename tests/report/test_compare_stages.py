"""Comparison mode gates every stage of a step: a slower stage fails and is named, even when the step total passes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from r1_ascend.report.cli import main
from r1_ascend.report.compare import STAGE_NAMES

from .conftest import RunWriter

STEPS = range(1, 15)
# the fixture's timing key that makes each stage slower without touching the others
STAGE_TIMERS = {
    "gen": "generate_sequences",
    "reshard": "reshard",
    "reward": "reward",
    "old_log_prob": "old_log_prob",
    "ref": "ref",
    "update": "update_actor",
}


@pytest.fixture(scope="module")
def baseline(verl_modules, tmp_path_factory) -> Path:
    writer = RunWriter(verl_modules, tmp_path_factory.mktemp("stages") / "baseline", seed=41)
    writer.segment(STEPS, test_freq=1000)
    return writer.run.log_files[0]


def _candidate(verl_modules, directory: Path, scale: dict[str, float]) -> RunWriter:
    writer = RunWriter(verl_modules, directory, seed=41)  # same draws as the baseline
    writer.segment(STEPS, test_freq=1000, stage_scale=scale)
    return writer


def _row(out: str, label: str) -> str:
    return next(line for line in out.splitlines() if line.startswith(f"| {label} time (s, mean)"))


def test_every_stage_has_a_gate() -> None:
    assert set(STAGE_TIMERS) == set(STAGE_NAMES)


def test_slower_reshard_is_named_although_step_time_and_throughput_pass(
    baseline: Path, verl_modules, tmp_path: Path, capsys
) -> None:
    candidate = _candidate(verl_modules, tmp_path / "cand", {"reshard": 1.5})
    argv = ["--baseline", str(baseline), "--candidate", str(candidate.run.log_files[0])]
    assert main(argv) == 1
    out = capsys.readouterr().out
    for total in ("| throughput", "| step time"):
        assert next(line for line in out.splitlines() if line.startswith(total)).endswith("| ok |"), total
    reshard = _row(out, "reshard")
    assert "REGRESSION" in reshard
    # the change computed from the fixture's inputs: gen − generate_sequences, steps 5–14
    truth = candidate.run.truth
    cand = np.mean([truth[s].timing["gen"] - truth[s].timing["generate_sequences"] for s in range(5, 15)])
    base = cand / 1.5
    assert f"{(cand - base) / base:+.2%}" in reshard
    assert "Regressed stage(s): reshard (+50.00%" in out
    for other in ("gen", "reward", "old log-prob", "ref", "update"):
        assert _row(out, other).endswith("| ok |"), other


@pytest.mark.parametrize("stage", STAGE_NAMES)
def test_each_stage_gate_catches_its_own_slowdown(stage: str, baseline: Path, verl_modules, tmp_path: Path) -> None:
    candidate = _candidate(verl_modules, tmp_path / "cand", {STAGE_TIMERS[stage]: 1.3})
    argv = ["--baseline", str(baseline), "--candidate", str(candidate.run.log_files[0])]
    # only the stage gates and this stage's: the totals may or may not move
    others = [f"{name}=off" for name in STAGE_NAMES if name != stage]
    totals_off = [f"--max-{name}" for name in ("throughput-drop", "step-time-increase")]
    switches = [x for name in others for x in ("--max-stage-increase", name)]
    off = [x for flag in totals_off for x in (flag, "off")]
    assert main([*argv, *off, *switches, "--stage-noise-floor-s", "0"]) == 1
    assert main([*argv, *off, "--max-stage-increase", f"{stage}=0.31", "--stage-noise-floor-s", "0"]) == 0


def test_floor_off_switch_and_bad_stage_name(baseline: Path, verl_modules, tmp_path: Path, capsys) -> None:
    candidate = _candidate(verl_modules, tmp_path / "cand", {"reshard": 1.5})
    argv = ["--baseline", str(baseline), "--candidate", str(candidate.run.log_files[0])]
    assert main([*argv, "--stage-noise-floor-s", "1000"]) == 0  # +30 s is under a 1000 s floor
    capsys.readouterr()
    assert main([*argv, "--max-stage-increase", "reshard=off"]) == 0
    assert "| reshard time" not in capsys.readouterr().out
    assert main([*argv, "--max-stage-increase", "0.6"]) == 0  # +50 % is under a 60 % limit for every stage
    assert main([*argv, "--max-stage-increase", "resharding=0.1"]) == 2
