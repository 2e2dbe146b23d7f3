"""How a run ended and where it resumed, read from logs written as verl 0.6.1, tqdm and Ray write them."""

from __future__ import annotations

from pathlib import Path

import pytest

from r1_ascend.report.attempts import COMPLETED, DIED, ENDED
from r1_ascend.report.cli import main
from r1_ascend.report.lifecycle import LifecycleScanner, root_cause
from r1_ascend.report.run import load_run

from .conftest import SURVIVED_ERROR


def _report(paths: list[Path], out: Path, *extra: str) -> str:
    assert main([*map(str, paths), "--out", str(out), "--no-figures", *extra]) == 0
    return (out / "report.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("ray_prefixed", [False, True], ids=["driver-traceback", "ray-prefixed-worker-traceback"])
def test_run_that_died_with_an_error_names_the_step_and_the_error(
    run_writer, tmp_path: Path, capsys, ray_prefixed: bool
) -> None:
    writer = run_writer("died", seed=11)
    writer.segment(range(1, 5), planned=10, death="error", ray_prefixed_traceback=ray_prefixed)
    fixture = writer.run
    run = load_run(fixture.log_files)

    assert [a.outcome for a in run.attempts] == [DIED]
    attempt = run.attempts[0]
    assert (attempt.last_step, attempt.died_during, attempt.planned.total) == (3, 4, 10)
    assert attempt.error is not None
    assert attempt.error.text == fixture.error_line  # the worker's own exception, not Ray's wrapper
    assert "HCCL link check" not in attempt.error.text  # an error the run lived through is not its cause
    if not ray_prefixed:
        assert attempt.error_wrapper is not None
        assert attempt.error_wrapper.text == fixture.error_wrapper

    report = _report(fixture.log_files, tmp_path / "out")
    assert "Status: **DIED during step 4** (last completed step 3; planned last step 10)." in report
    assert f"Error: `{fixture.error_line}`" in report
    assert "Planned last step: 10, from verl: 'Total training steps: 10'" in report
    assert "DIED during step 4" in capsys.readouterr().out


def test_killed_run_has_no_error_line_and_says_so(run_writer, tmp_path: Path) -> None:
    writer = run_writer("killed", seed=12)
    writer.segment(range(1, 7), planned=10, death="kill")
    run = load_run(writer.run.log_files)
    assert run.attempts[0].outcome == DIED
    assert run.attempts[0].died_during == 6
    assert run.attempts[0].error is None  # the survived HCCL error after step 1 is not blamed
    report = _report(writer.run.log_files, tmp_path / "out")
    assert "**DIED during step 6** (last completed step 5; planned last step 10)" in report
    assert "No error line after step 5: the process was stopped from outside" in report


def test_completed_run(run_writer, tmp_path: Path) -> None:
    writer = run_writer("complete", seed=13)
    writer.segment(range(1, 6))
    run = load_run(writer.run.log_files)
    assert [a.outcome for a in run.attempts] == [COMPLETED]
    report = _report(writer.run.log_files, tmp_path / "out")
    assert "Status: completed: reached the planned last step 5." in report
    assert "| attempt |" not in report


def test_planned_last_step_from_the_run_config(run_writer, tmp_path: Path) -> None:
    writer = run_writer("config", seed=14)
    writer.segment(range(1, 5), announce_planned=False)
    log = writer.run.log_files[0]
    # a log without verl's 'Total training steps' line and without the progress bar
    kept = [line for line in log.read_text(encoding="utf-8").splitlines(True) if "Training Progress" not in line]
    log.write_text("".join(kept), encoding="utf-8")
    assert load_run([log]).attempts[0].outcome == ENDED
    assert "the planned last step is unknown" in _report([log], tmp_path / "unknown")

    hydra = writer.run.directory / "outputs" / ".hydra"
    hydra.mkdir(parents=True)
    (hydra / "config.yaml").write_text("trainer:\n  total_training_steps: 12\n  test_freq: 5\n", encoding="utf-8")
    run = load_run([writer.run.directory])
    assert (run.attempts[0].outcome, run.attempts[0].died_during) == (DIED, 5)
    assert "config `trainer.total_training_steps: 12`" in run.attempts[0].planned.origin
    # the same through --config with a log file
    explicit = load_run([log], config_paths=[hydra / "config.yaml"])
    assert explicit.attempts[0].planned.total == 12
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer: [unclosed\n", encoding="utf-8")
    assert main([str(log), "--config", str(bad), "--out", str(tmp_path / "bad")]) == 2


def test_resumed_run_after_a_death_shows_both_attempts(run_writer, tmp_path: Path) -> None:
    writer = run_writer("resumed", seed=15)
    writer.segment(range(1, 9), log_name="part1.log", planned=10, death="kill")  # killed inside step 8
    writer.segment(range(6, 11), log_name="part2.log", planned=10, resumed_from=5, val_before_train_step=5)
    run = load_run(writer.run.log_files)

    assert [(a.outcome, a.resumed_from) for a in run.attempts] == [(DIED, None), (COMPLETED, 5)]
    assert run.attempts[0].died_during == 8
    assert run.attempts[1].checkpoint_path == "checkpoints/global_step_5"
    assert [(p.restart_step, p.previous_max) for p in run.resume_points] == [(5, 7)]
    report = _report(writer.run.log_files, tmp_path / "out")
    assert "Status: completed: reached the planned last step 10." in report
    assert "| 1 | log start" in report
    assert "| died during step 8 |" in report
    assert "| 2 | checkpoint restore" in report
    assert "from `checkpoints/global_step_5`; steps 6–7 were run again" in report


def test_resume_found_by_the_progress_bar_restarting(run_writer, tmp_path: Path) -> None:
    writer = run_writer("bar", seed=16)
    writer.segment(range(1, 7), log_name="part1.log", planned=10, death="kill")  # last logged step 5
    writer.segment(range(6, 11), log_name="part2.log", planned=10, resumed_from=5)  # first logged step 6
    combined = tmp_path / "combined.log"
    announcements = ("Setting global step", "Load from checkpoint", "Resuming from", "Total training steps")
    lines = [
        line
        for path in writer.run.log_files
        for line in path.read_text(encoding="utf-8").splitlines(True)
        if not any(a in line for a in announcements)
    ]
    combined.write_text("".join(lines), encoding="utf-8")
    run = load_run([combined])
    # no step number repeats (5, then 6): only tqdm's bar starting again at 5/10 shows the restart
    assert [(p.restart_step, p.previous_max) for p in run.resume_points] == [(5, 5)]
    assert "'Training Progress' bar restarted at step 5" in run.resume_points[0].reason
    assert [a.outcome for a in run.attempts] == [DIED, COMPLETED]


def test_traceback_scanner_follows_each_process_and_picks_the_innermost_cause() -> None:
    scanner = LifecycleScanner("job.log")
    lines = [
        "(TaskRunner pid=1) Traceback (most recent call last):",
        "(WorkerDict pid=2) INFO loading shard 3",
        '(TaskRunner pid=1)   File "ray_trainer.py", line 1, in fit',
        "(TaskRunner pid=1) ray.exceptions.RayTaskError(RuntimeError): ray::WorkerDict.update_actor()",
        '(TaskRunner pid=1)   File "megatron_actor.py", line 9, in update_policy',
        "(TaskRunner pid=1) RuntimeError: NPU out of memory. Tried to allocate 2.00 GiB",
        "(TaskRunner pid=1) Training Progress:  40%|####  | 4/10",
        "ERROR 11-20 08:01:02 [engine.py:12] engine died",
    ]
    events = [e for n, line in enumerate(lines) for e in scanner.scan(line, n + 1, n)]
    cause, wrapper = root_cause([e for e in events if e.kind == "error"])
    assert cause is not None
    assert wrapper is not None
    assert cause.text == "RuntimeError: NPU out of memory. Tried to allocate 2.00 GiB"
    assert wrapper.text.startswith("ray.exceptions.RayTaskError(RuntimeError)")
    assert root_cause([e for e in events if e.kind == "error" and e.block is None])[0].text.startswith("ERROR 11-20")


def test_survived_error_constant_is_an_error_line() -> None:
    # guards the fixture: the survived error must look like an error, or the tests above prove nothing
    events = LifecycleScanner("x").scan(SURVIVED_ERROR, 1, 0)
    assert [e.kind for e in events] == ["error"]


def test_restart_from_scratch_after_a_death_before_the_first_checkpoint(run_writer, tmp_path: Path) -> None:
    writer = run_writer("scratch", seed=17)
    writer.segment(range(1, 4), log_name="part1.log", planned=6, death="error")  # dies in step 3, no checkpoint yet
    writer.segment(range(1, 7), log_name="part2.log", planned=6)
    part2 = writer.run.log_files[1]
    text = part2.read_text(encoding="utf-8")
    marker = "Total training steps: 6\n"
    part2.write_text(text.replace(marker, marker + "(TaskRunner pid=48213) Training from scratch\n", 1), "utf-8")
    combined = tmp_path / "combined.log"
    combined.write_text(
        "".join(p.read_text(encoding="utf-8") for p in writer.run.log_files).replace("Total training steps", "Total"),
        encoding="utf-8",
    )
    run = load_run([combined])
    assert [a.outcome for a in run.attempts] == [DIED, COMPLETED]
    assert run.attempts[0].died_during == 3
    assert run.attempts[0].error is not None
    assert run.attempts[0].error.text == writer.run.error_line
    assert run.attempts[1].start.startswith("fresh start")
    assert [(p.restart_step, p.previous_max) for p in run.resume_points] == [(1, 2)]
    assert "restarted from scratch" in run.resume_points[0].reason


def test_validation_only_log_has_no_training_status(tmp_path: Path) -> None:
    log = tmp_path / "val_only.log"
    log.write_text("(TaskRunner pid=1) step:0 - val-core/aime24/acc/mean@2:0.25\n", encoding="utf-8")
    report = _report([log], tmp_path / "out")
    assert "Status: no training step was logged with no error in the log" in report


def _events(*kinds_steps: tuple[str, int | None]) -> list:
    from r1_ascend.report.lifecycle import LifecycleEvent

    return [
        LifecycleEvent("console.log", line, kind, line, step=step, total=4)
        for line, (kind, step) in enumerate(kinds_steps)
    ]


@pytest.mark.parametrize("resumed", [False, True], ids=["fresh", "resumed"])
def test_progress_bar_echoed_before_the_first_step_is_the_same_process(resumed: bool) -> None:
    """Ray echoes a process's tqdm bar (with and without its prefix): one process, one attempt."""
    from r1_ascend.report.attempts import AttemptTracker
    from r1_ascend.report.lifecycle import FRESH_START, LOOP_START, PLANNED, RESUME

    opening = (RESUME, 2) if resumed else (FRESH_START, None)
    tracker = AttemptTracker()
    for event in _events(
        (PLANNED, None), opening, (LOOP_START, 2 if resumed else 0), (LOOP_START, 2 if resumed else 0)
    ):
        tracker.event(event)
    tracker.record(3 if resumed else 1, True, "console.log", 10, repeats=False)
    assert len(tracker.attempts) == 1
    assert tracker.attempts[0].resumed_from == (2 if resumed else None)


def test_once_per_process_line_seen_again_before_any_step_is_a_new_process() -> None:
    """A process that died before its first step and was relaunched: two attempts."""
    from r1_ascend.report.attempts import AttemptTracker
    from r1_ascend.report.lifecycle import PLANNED

    tracker = AttemptTracker()
    for event in _events((PLANNED, None), (PLANNED, None)):
        tracker.event(event)
    assert len(tracker.attempts) == 2
