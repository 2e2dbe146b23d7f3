"""Comparison mode: a planted 10 % throughput regression fails, an unchanged run passes, missing data is an error."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from r1_ascend.report.cli import main
from r1_ascend.report.compare import Thresholds, compare_runs, exit_code
from r1_ascend.report.run import load_run
from r1_ascend.report.timing import parse_window

STEPS = range(1, 16)


@pytest.fixture(scope="module")
def runs(module_run_writer):
    """Written once for the module; the tests only read them (what they write goes to their own tmp_path)."""
    baseline = module_run_writer("baseline", seed=21)
    baseline.segment(STEPS, tensorboard=True)
    unchanged = module_run_writer("unchanged", seed=21)
    unchanged.segment(STEPS)
    # same run, 10 % fewer tokens in the same step time: throughput -10 %, everything else identical
    slower = module_run_writer("slower", seed=21, token_scale=0.9)
    slower.segment(STEPS)
    return baseline.run, unchanged.run, slower.run


def test_planted_throughput_regression_fails_with_exit_1(runs, capsys) -> None:
    baseline, _, slower = runs
    argv = ["--baseline", str(baseline.directory), "--candidate", str(slower.log_files[0]), "--window", "5:14"]
    assert main(argv) == 1
    out = capsys.readouterr().out
    throughput_line = next(line for line in out.splitlines() if line.startswith("| throughput"))
    assert "REGRESSION" in throughput_line
    expected_base = np.mean(
        [sum(baseline.truth[s].tokens) / (baseline.truth[s].timing["step"] * 256) for s in range(5, 15)]
    )
    expected_cand = np.mean(
        [sum(slower.truth[s].tokens) / (slower.truth[s].timing["step"] * 256) for s in range(5, 15)]
    )
    assert f"{expected_base:.4g} (n=10)" in throughput_line
    assert f"{expected_cand:.4g} (n=10)" in throughput_line
    assert f"{(expected_cand - expected_base) / expected_base:+.2%}" in throughput_line
    for other in ("| step time", "| peak memory", "| reward"):
        assert next(line for line in out.splitlines() if line.startswith(other)).endswith("| ok |")
    assert out.rstrip().endswith("FAIL: regression")


def test_unchanged_run_passes_with_exit_0(runs, capsys, tmp_path: Path) -> None:
    baseline, unchanged, _ = runs
    out_dir = tmp_path / "cmp"
    argv = ["--baseline", str(baseline.log_files[0]), "--candidate", str(unchanged.directory), "--out", str(out_dir)]
    assert main(argv) == 0
    assert "REGRESSION" not in capsys.readouterr().out
    assert "| throughput" in (out_dir / "comparison.md").read_text(encoding="utf-8")


def test_thresholds_decide(runs) -> None:
    baseline, _, slower = runs
    base, cand = load_run(baseline.log_files), load_run(slower.log_files)
    window = parse_window("5:14")
    assert exit_code(compare_runs(base, cand, window, Thresholds(max_throughput_drop=0.11))) == 0
    assert exit_code(compare_runs(base, cand, window, Thresholds(max_throughput_drop=0.09))) == 1
    # the step time is unchanged, so a zero tolerance on it still passes
    assert exit_code(compare_runs(base, cand, window, Thresholds(None, 0.0, None, None))) == 0


def test_switched_off_check_and_missing_metric(runs, tmp_path: Path, capsys) -> None:
    baseline, _, slower = runs
    argv = ["--baseline", str(baseline.directory), "--candidate", str(slower.directory)]
    assert main([*argv, "--max-throughput-drop", "off"]) == 0

    no_memory = tmp_path / "no_memory.log"
    text = slower.log_files[0].read_text(encoding="utf-8")
    no_memory.write_text(text.replace("perf/max_memory_allocated_gb", "perf/other"), encoding="utf-8")
    capsys.readouterr()
    assert (
        main(["--baseline", str(baseline.directory), "--candidate", str(no_memory), "--max-throughput-drop", "off"])
        == 2
    )
    assert "MISSING DATA (not logged in the window by the candidate)" in capsys.readouterr().out
    # a regression is still reported as such even when another check lacks data
    assert main(["--baseline", str(baseline.directory), "--candidate", str(no_memory)]) == 1


def test_window_outside_the_run_is_missing_data(runs) -> None:
    baseline, unchanged, _ = runs
    argv = ["--baseline", str(baseline.directory), "--candidate", str(unchanged.directory), "--window", "50:60"]
    assert main(argv) == 2


def test_candidate_that_stopped_inside_the_window_does_not_pass(runs, run_writer, capsys) -> None:
    baseline, _, _ = runs
    crashed = run_writer("crashed", seed=21)
    crashed.segment(range(1, 10))  # same numbers as the baseline, but the log ends after step 9
    argv = ["--baseline", str(baseline.directory), "--candidate", str(crashed.run.directory), "--window", "5:14"]
    assert main(argv) == 2
    out = capsys.readouterr().out
    throughput_line = next(line for line in out.splitlines() if line.startswith("| throughput"))
    assert "(n=10)" in throughput_line
    assert "(n=5)" in throughput_line
    assert "MISSING DATA (the runs logged this metric on different numbers of steps" in throughput_line
    assert "the candidate is incomplete" in throughput_line
    assert "REGRESSION" not in out  # means over different steps are not compared at all
    assert out.rstrip().endswith("ERROR: missing data")
    # the same run compared over the steps both logged passes
    assert main([*argv[:-1], "5:9"]) == 0


@pytest.mark.parametrize(
    "argv",
    [
        ["--baseline", "a"],
        ["x.log", "--baseline", "a", "--candidate", "b"],
        ["--baseline", "a", "--candidate", "b", "--max-throughput-drop", "-1"],
        ["--baseline", "a", "--candidate", "b", "--window", "x"],
        ["--baseline", "a", "--candidate", "b"],  # paths do not exist
    ],
)
def test_usage_errors_exit_2(argv: list[str]) -> None:
    assert main(argv) == 2
