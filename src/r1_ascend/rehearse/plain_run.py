"""The plain rehearsal's scenario: run 1 is killed mid-step, run 2 is relaunched as an operator relaunches it
(``ray_start_npu.sh restart`` on every node: the worker says it is still joined, the head launches again) and resumes
on the same cluster; then the verdicts, ``r1-ascend report`` on the console logs the head kept under OUTPUT_DIR and
the export of the final checkpoint."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from r1_ascend.rehearse.cluster import kill_mid_step, relaunch, restart_worker
from r1_ascend.rehearse.export import export
from r1_ascend.rehearse.lifecycle import check_rollout_path
from r1_ascend.rehearse.progress import RehearsalError, log_progress, read_log
from r1_ascend.rehearse.session import Session
from r1_ascend.rehearse.verdicts import judge, judge_training

#: A Ray log-forwarding prefix naming a node IP, e.g. "(WorkerDict pid=12, ip=127.0.0.3)", colour codes optional.
FORWARDED_WITH_IP = re.compile(r"^(?:\x1b\[\d+m)?\([^()]*\bpid=\d+, ip=[^()]*\)")


def single_copy(log: Path, target_dir: Path) -> Path:
    """The driver log with each forwarded worker line once, written to ``target_dir``.

    The simulated nodes share one host and therefore one Ray session directory, so the log monitor of every node
    forwards every worker line: once plain and once tagged with a node IP. On a real cluster each line arrives once.
    """
    kept = [line for line in read_log(log).splitlines(keepends=True) if not FORWARDED_WITH_IP.match(line)]
    target_dir.mkdir(parents=True, exist_ok=True)
    target = target_dir / log.name
    target.write_text("".join(kept))
    return target


def head_logs(out: Path) -> list[Path]:
    """The console logs the head kept under its OUTPUT_DIR (``logs/``), one per launch, oldest first."""
    return sorted((out / "logs").glob("*.log"), key=lambda p: (p.stat().st_mtime, p.name))


def run_report(out: Path, logs: list[Path]) -> Path:
    report_dir = out / "report"
    logs = [single_copy(log, out / "report-inputs") for log in logs]
    cmd = [sys.executable, "-m", "r1_ascend.cli", "report", *map(str, logs), str(out / "tensorboard")]
    done = subprocess.run(
        [*cmd, "--out", str(report_dir), "--name", "rehearsal"], capture_output=True, text=True, check=False
    )
    (out / "report.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0 or not (report_dir / "report.md").is_file():
        raise RehearsalError(f"r1-ascend report failed ({done.returncode}); log: {out / 'report.log'}")
    return report_dir / "report.md"


def drive(session: Session) -> tuple[int, set[int]]:
    """Kill run 1 mid-step after its first checkpoint, then run 2 on the same cluster: (killed step, killed pids)."""
    killed = kill_mid_step(session.driver, session.out, session.plan, session.logs[0])
    for env in session.cluster.envs[1:]:
        said = restart_worker(session.cluster, env)
        log_progress(f"restart on worker {env['NODE_IP']}: {said.strip().splitlines()[-1]}")
    log_progress(f"run 2: ray_start_npu.sh restart on the head (log {session.logs[1]})")
    relaunch(session.cluster, session.logs[1], timeout=900)
    return killed


def judge_plain(session: Session, killed: tuple[int, set[int]]) -> dict[str, object]:
    out, plan, logs = session.out, session.plan, session.logs
    summary = judge(out, logs, plan, *killed)
    summary.update(check_rollout_path(out / "lifecycle", killed[1]))
    summary.update(judge_training(out, logs, plan))
    summary["ray_temp_dir"] = session.cluster.temp_dir
    summary["netns"] = session.cluster.netns
    kept = head_logs(out)
    if len(kept) != 2:
        raise RehearsalError(f"the head kept {len(kept)} console logs under {out / 'logs'}; one per launch is 2")
    summary["head_logs"] = [str(p) for p in kept]
    summary["report"] = str(run_report(out, kept))
    final = out / "checkpoints" / f"global_step_{plan.total_steps}"
    log_progress(f"export: convert-weights to-hf {final}, then a strict transformers load and a greedy answer")
    summary["export"] = export(final, out / "exported-hf", out / "export.log")
    return summary
