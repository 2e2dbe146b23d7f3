"""`r1-ascend report` on fixture runs written by verl's own loggers; numbers checked against the fixture inputs."""

from __future__ import annotations

import csv
import struct
from pathlib import Path

import numpy as np
import pytest

from r1_ascend.report.cli import main
from r1_ascend.report.run import RunInputError, load_run
from r1_ascend.report.timing import build_timing_table, parse_window

from .conftest import VAL_SAMPLES

DIES_PER_CARD = 2
N_GPUS = 256


def _expected_row(truth) -> dict[str, float]:
    """Seed columns from the fixture's raw inputs, without the report code."""
    step_time = truth.timing["step"]
    per_die = sum(truth.tokens) / (step_time * N_GPUS)
    reshard = truth.timing.get("reshard", truth.timing["gen"] - truth.timing["generate_sequences"])
    return {
        "prompt_len": float(np.mean(truth.prompt_lengths)),
        "response_len": float(np.mean(truth.response_lengths)),
        "step_s": step_time,
        "tps_card": DIES_PER_CARD * per_die,
        "tps_die": per_die,
        "gen_s": truth.timing["gen"],
        "reshard_s": reshard,
        "reward_s": truth.timing["reward"],
        "old_log_prob_s": truth.timing["old_log_prob"],
        "ref_s": truth.timing["ref"],
        "update_s": truth.timing["update_actor"],
    }


def _read_csv(path: Path) -> dict[int, dict[str, str]]:
    with path.open(encoding="utf-8") as handle:
        return {int(row["step"]): row for row in csv.DictReader(handle)}


def _png_size(path: Path) -> tuple[int, int]:
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    assert header[12:16] == b"IHDR"
    return struct.unpack(">II", header[16:24])


def test_report_on_fixture_run_writes_table_figures_and_samples(run_writer, tmp_path: Path, capsys) -> None:
    writer = run_writer("full", seed=3)
    writer.segment(range(1, 13), tensorboard=True, dumps=True, val_before_train_step=0)
    run = writer.run
    out = tmp_path / "out"

    assert main([str(run.directory), "--out", str(out), "--window", "3:10"]) == 0

    rows = _read_csv(out / "timing.csv")
    assert sorted(rows) == list(range(1, 13))  # step 0 is validation only: not a timing row
    for step, truth in run.truth.items():
        if step == 0:
            continue
        for column, expected in _expected_row(truth).items():
            assert float(rows[step][column]) == pytest.approx(expected, rel=1e-9), (step, column)

    # window means computed independently from the fixture inputs
    expected_rows = [_expected_row(run.truth[s]) for s in range(3, 11)]
    report = (out / "report.md").read_text(encoding="utf-8")
    mean_line = next(line for line in report.splitlines() if line.startswith("| **mean 3–10**"))
    cells = [c.strip().strip("*") for c in mean_line.strip("|").split("|")][1:]
    columns = list(_expected_row(run.truth[1]))
    for column, cell in zip(columns, cells, strict=True):
        expected = np.mean([r[column] for r in expected_rows])
        assert float(cell) == pytest.approx(expected, abs=0.051), column

    assert "derived as `timing_s/gen` − `timing_s/generate_sequences`" in report
    assert "Resume points: none" in report
    # validation: verl's val-core accuracy per data source, last value equals the fixture's last validation
    last_val_step = max(s for s, t in run.truth.items() if t.val_acc)
    for source, acc in run.truth[last_val_step].val_acc.items():
        line = next(line for line in report.splitlines() if line.startswith(f"| {source} | acc mean@"))
        assert f"{acc:.4f} (step {last_val_step})" in line
    # samples from the rollout dump of the last step, with ground truth and reward details
    assert "## Sample generations" in report
    assert "Problem 12.0: what is 0 + 12?" in report
    assert "Ground truth: `12`" in report

    for name in ("reward", "reward_components", "validation", "response_length", "kl_entropy", "throughput", "memory"):
        assert _png_size(out / f"{name}.png") == (1200, 700), name
        assert f"]({name}.png)" in report
    printed = capsys.readouterr().out
    assert "mean over steps 3–10" in printed
    # best validation value and its step, computed from the fixture
    for source in run.truth[last_val_step].val_acc:
        history = [(t.val_acc[source], s) for s, t in sorted(run.truth.items()) if t.val_acc]
        best_value, best_step = max(history, key=lambda pair: pair[0])  # first step reaching the maximum
        line = next(line for line in report.splitlines() if line.startswith(f"| {source} | acc mean@"))
        assert line.rstrip().endswith(f"| {best_value:.4f} (step {best_step}) |"), line


def test_default_window_names_the_actual_steps_and_no_figures_means_no_curves(run_writer, tmp_path: Path) -> None:
    writer = run_writer("plain", seed=5)
    writer.segment(range(1, 7), tensorboard=False, dumps=False)
    out = tmp_path / "out"
    assert main([str(writer.run.directory), "--out", str(out), "--no-figures"]) == 0
    report = (out / "report.md").read_text(encoding="utf-8")
    assert "Averaging window: steps first–last, i.e. 1–6 (inclusive); 6 step(s)." in report
    assert "## Curves" not in report
    assert not list(out.glob("*.png"))


def test_reward_components_come_from_the_generation_dumps(run_writer) -> None:
    writer = run_writer("dumps", seed=4)
    writer.segment(range(1, 4), dumps=True)
    run = load_run([writer.run.directory])
    for step, truth in writer.run.truth.items():
        assert run.reward_components["rollout_data/acc"][step] == pytest.approx(np.mean(truth.sequence_scores))
        assert run.reward_components["rollout_data/score"][step] == pytest.approx(np.mean(truth.sequence_scores))
        assert run.reward_components["rollout_data/format"][step] == pytest.approx(0.5)
    assert not any(name.endswith(("/pred", "/fail_reason")) for name in run.reward_components)  # text, not curves


def test_truncated_log_keeps_complete_values_and_reports_the_rest(run_writer, tmp_path: Path) -> None:
    writer = run_writer("truncated", seed=5)
    writer.segment(range(1, 7))
    log = writer.run.log_files[0]
    text = log.read_text(encoding="utf-8")
    last_line_start = text.rindex("step:6 - ")
    cut = text.index(" - timing_s/gen:", last_line_start) + len(" - timing_s/gen:") + 2  # two digits of the value
    log.write_text(text[:cut], encoding="utf-8")

    run = load_run([log])
    assert "timing_s/gen" not in run.steps[6]  # a partial "timing_s/gen:4x" is not taken as a value
    assert run.steps[6]["actor/entropy"] == writer.run.truth[6].entropy  # values before the cut survive
    assert "timing_s/step" not in run.steps[6]
    assert any("cut off" in p for p in run.problems)

    out = tmp_path / "out"
    assert main([str(log), "--out", str(out)]) == 0
    rows = _read_csv(out / "timing.csv")
    assert rows[6]["step_s"] == ""
    assert rows[6]["gen_s"] == ""
    assert float(rows[5]["step_s"]) == writer.run.truth[5].timing["step"]
    report = (out / "report.md").read_text(encoding="utf-8")
    assert "- step (s) (`timing_s/step`): steps 6" in report
    assert "## Log problems (1)" in report


def test_tensorboard_fills_what_a_truncated_console_log_lost(run_writer) -> None:
    writer = run_writer("tb_fill", seed=6)
    writer.segment(range(1, 5), tensorboard=True)
    log = writer.run.log_files[0]
    text = log.read_text(encoding="utf-8")
    log.write_text(text[: text.rindex("step:4 - ")], encoding="utf-8")  # step 4 lost entirely from the console

    run = load_run([writer.run.directory])
    assert run.steps[3]["timing_s/step"] == writer.run.truth[3].timing["step"]  # console value, exact
    assert run.steps[4]["timing_s/step"] == pytest.approx(writer.run.truth[4].timing["step"], rel=1e-6)  # float32
    assert run.filled_from_tensorboard > 0


def test_tensorboard_only_run(run_writer) -> None:
    writer = run_writer("tb_only", seed=7)
    writer.segment(range(1, 4), tensorboard=True)
    run = load_run([writer.run.event_dir])
    table = build_timing_table(run, parse_window("1:3"))
    for step in (1, 2, 3):
        expected = _expected_row(writer.run.truth[step])
        assert table.rows[step]["tps_card"] == pytest.approx(expected["tps_card"], rel=1e-6)


def test_resumed_run_last_occurrence_wins_and_resume_is_reported(run_writer, tmp_path: Path) -> None:
    writer = run_writer("resumed", seed=8)
    writer.segment(range(1, 8), log_name="train_part1.log", tensorboard=True, planned=10)  # crashed after step 7
    # restart from the step-5 checkpoint: verl validates at step 5, then re-runs 6 and 7 and continues
    writer.segment(
        range(6, 11), log_name="train_part2.log", tensorboard=True, resumed_from=5, val_before_train_step=5, planned=10
    )
    truth = writer.run.truth
    run = load_run(writer.run.log_files)

    assert sorted(run.training_steps()) == list(range(1, 11))
    for step in range(1, 11):
        assert run.steps[step]["timing_s/step"] == truth[step].timing["step"], step
    # step 5 keeps its training metrics from part 1 and takes the validation of part 2
    assert run.steps[5]["actor/entropy"] == truth[5].entropy
    for source, acc in truth[5].val_acc.items():
        assert run.steps[5][f"val-core/{source}/acc/mean@{VAL_SAMPLES}"] == pytest.approx(acc)
    assert len(run.resume_points) == 1
    point = run.resume_points[0]
    assert (point.restart_step, point.previous_max) == (5, 7)
    assert "Setting global step to 5" in point.reason

    # the same rule without verl's announcement: one log holding both segments
    combined = tmp_path / "combined.log"
    combined.write_text(
        "".join(p.read_text(encoding="utf-8") for p in writer.run.log_files).replace(
            "Setting global step", "(announcement removed)"
        ),
        encoding="utf-8",
    )
    again = load_run([combined])
    assert [(p.restart_step, p.previous_max) for p in again.resume_points] == [(5, 7)]
    assert again.steps == run.steps

    out = tmp_path / "out"
    assert main([*map(str, writer.run.log_files), "--out", str(out)]) == 0
    report = (out / "report.md").read_text(encoding="utf-8")
    assert "restart at step 5" in report
    assert _png_size(out / "throughput.png") == (1200, 700)

    # TensorBoard alone: the second event file restarts at step 5
    tb_run = load_run([writer.run.event_dir])
    assert [(p.restart_step, p.previous_max) for p in tb_run.resume_points] == [(5, 7)]
    assert tb_run.steps[7]["timing_s/step"] == pytest.approx(truth[7].timing["step"], rel=1e-6)


def test_dedicated_reshard_timer_is_preferred(run_writer) -> None:
    writer = run_writer("reshard", seed=9)
    writer.segment(range(1, 3), reshard_timer=True)
    table = build_timing_table(load_run(writer.run.log_files), parse_window("1:2"))
    for step in (1, 2):
        assert table.rows[step]["reshard_s"] == writer.run.truth[step].timing["reshard"]
    assert table.reshard_sources == {"timer": 2}


def test_missing_keys_are_reported_not_guessed(tmp_path: Path) -> None:
    log = tmp_path / "minimal.log"
    log.write_text("step:1 - timing_s/step:100.0 - perf/throughput:50.0\nstep:2 - timing_s/step:110.0\n")
    out = tmp_path / "out"
    assert main([str(log), "--out", str(out)]) == 0
    rows = _read_csv(out / "timing.csv")
    assert rows[1]["tps_card"] == "100.0"
    assert rows[2]["tps_card"] == ""
    assert rows[1]["reshard_s"] == ""
    report = (out / "report.md").read_text(encoding="utf-8")
    assert "Reshard: n/a (not logged" in report
    assert "**100.0** (n=1/2)" in report  # per-card mean over the one step that logged it
    assert "## Sample generations" in report
    assert "the run logged no generations" in report
    assert not (out / "validation.png").exists()


def test_input_errors_exit_2(tmp_path: Path, capsys) -> None:
    empty = tmp_path / "empty.log"
    empty.write_text("nothing here\n")
    assert main([str(empty)]) == 2
    assert "no verl metrics found" in capsys.readouterr().err
    assert main([str(tmp_path / "absent.log")]) == 2
    assert main([]) == 2
    from r1_ascend.cli import main as r1_ascend_main

    assert r1_ascend_main(["report", str(empty)]) == 2
    assert main([str(empty), "--window", "9:3"]) == 2
    with pytest.raises(RunInputError):
        load_run([empty])
