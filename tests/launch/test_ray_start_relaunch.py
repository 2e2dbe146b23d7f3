"""scripts/ray_start_npu.sh as an operator drives it: overrides given once reach the preflight and the training, the
head keeps its console under OUTPUT_DIR, ``restart`` relaunches with Ray kept, ``--detach`` survives its terminal,
and each node says what it did.

``ray`` and ``python`` are stand-ins at the narrowest boundary: ``ray`` prints Ray's startup line and blocks as
``ray start --block`` does; ``python`` records every call and answers the cluster checks as a complete cluster of
nodes that see OUTPUT_DIR would, the preflight as passed and the training as a short run. Everything between — the
action and override parsing, the run script it launches (the real one, called as the head calls it), the logs, the
PID records, the restart rules — is the shipped code. Ray itself is in test_ray_start.py and the rehearsal.
"""

from __future__ import annotations

import os
import signal
import subprocess
import textwrap
import time
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "ray_start_npu.sh"

FAKE_RAY = """\
#!/usr/bin/env bash
echo "Ray runtime started."
exec sleep 600
"""

FAKE_PYTHON = textwrap.dedent(
    """\
    #!/usr/bin/env bash
    [[ "$1" != -P ]] || shift  # the scripts keep the working directory off sys.path
    printf '%s\\n' "$*" >> "${FAKE_CALLS}"
    case "$2" in
        r1_ascend.launch.ray_cluster) echo "ray cluster ready (stand-in)"; exit 0 ;;
        r1_ascend.cli) echo "preflight: passed (stand-in)"; exit 0 ;;
        r1_ascend.recipe.main_grpo)
            echo "training: step:1 (stand-in)"
            sleep "${FAKE_TRAIN_SECONDS:-0}"
            exit "${FAKE_TRAIN_EXIT:-0}" ;;
    esac
    echo "unexpected call: $*" >&2
    exit 3
    """
)


@pytest.fixture
def node(tmp_path):
    """``run(*argv, **env)`` on one node whose IP is the head's; stops what it started afterwards."""
    for name, text in (("ray", FAKE_RAY), ("python", FAKE_PYTHON)):
        (tmp_path / name).write_text(text)
        (tmp_path / name).chmod(0o755)
    base = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("R1_ASCEND_", "VLLM_", "HCCL_", "RAY_"))},
        "RAY": str(tmp_path / "ray"),
        "PYTHON": str(tmp_path / "python"),
        "FAKE_CALLS": str(tmp_path / "calls"),
        "NNODES": "1",
        "NPUS_PER_NODE": "16",
        "NODE_IP": "127.0.0.2",
        "MASTER_ADDR": "127.0.0.2",
        "RAY_TEMP_DIR": str(tmp_path / "ray-temp"),
        "R1_ASCEND_RUN_DIR": str(tmp_path / "run"),
        "R1_ASCEND_CONFIG": "grpo_deepseekv3_smoke",
        "OUTPUT_DIR": str(tmp_path / "outputs"),
    }

    def run(*argv: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", str(SCRIPT), *argv], env={**base, **env}, capture_output=True, text=True, timeout=120
        )

    run.tmp = tmp_path  # type: ignore[attr-defined]
    yield run
    run("stop")


def calls(tmp_path: Path, module: str) -> list[str]:
    lines = (tmp_path / "calls").read_text().splitlines() if (tmp_path / "calls").exists() else []
    return [line for line in lines if line.startswith(f"-m {module} ")]


def logs(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "outputs" / "logs").glob("*.log"), key=lambda p: p.stat().st_mtime)


def test_an_override_given_once_reaches_the_preflight_and_the_training(node):
    done = node("start", "trainer.save_freq=7", "+ray_kwargs.ray_init.num_cpus=3")
    assert done.returncode == 0, done.stdout + done.stderr
    (preflight,) = calls(node.tmp, "r1_ascend.cli")
    (training,) = calls(node.tmp, "r1_ascend.recipe.main_grpo")
    for seen in (preflight, training):
        assert "trainer.save_freq=7" in seen.split()
        assert "+ray_kwargs.ray_init.num_cpus=3" in seen.split()
        assert "--config-name=grpo_deepseekv3_smoke" in seen or "--config grpo_deepseekv3_smoke" in seen
    assert preflight.startswith("-m r1_ascend.cli preflight")


def test_the_head_keeps_its_console_under_output_dir(node):
    done = node("start")
    assert done.returncode == 0, done.stdout + done.stderr
    (log,) = logs(node.tmp)
    assert done.stdout.splitlines()[0] == f"log: {log} (the console of this run, also kept there)"
    kept = log.read_text()
    assert "role head" in kept  # the head's own lines ...
    assert "training: step:1 (stand-in)" in kept  # ... and the training's
    assert f"TensorBoard events in {node.tmp / 'outputs' / 'tensorboard' / 'grpo_deepseekv3_smoke'}" in kept


def test_restart_relaunches_on_the_kept_ray_with_new_overrides_and_start_refuses(node):
    first = node("start", FAKE_TRAIN_EXIT="1")  # the run fails
    assert first.returncode == 1
    ray_pid = (node.tmp / "run" / "ray-head-127.0.0.2.pid").read_text().strip()
    again = node("start")
    assert again.returncode != 0
    assert "bash scripts/ray_start_npu.sh restart" in again.stderr
    restart = node("restart", "trainer.total_training_steps=9")
    assert restart.returncode == 0, restart.stdout + restart.stderr
    assert f"restart: keeping the Ray head (pid {ray_pid}" in restart.stdout
    assert (node.tmp / "run" / "ray-head-127.0.0.2.pid").read_text().strip() == ray_pid
    launches = calls(node.tmp, "r1_ascend.recipe.main_grpo")
    assert len(launches) == 2
    assert "trainer.total_training_steps=9" in launches[1].split()
    assert "trainer.total_training_steps=9" not in launches[0].split()
    assert len(logs(node.tmp)) == 2  # one console log per launch


def test_a_detached_head_survives_its_terminal_and_restart_waits_for_it(node):
    done = node("start", "--detach", FAKE_TRAIN_SECONDS="60")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("detached: pid ")
    pid = int(done.stdout.split()[2].rstrip(";"))
    deadline = time.monotonic() + 60
    while os.getsid(pid) != pid and time.monotonic() < deadline:  # the background shell execs setsid just after
        time.sleep(0.05)
    assert os.getsid(pid) == pid, "the detached run leads a session of its own: a closed terminal does not end it"
    while not calls(node.tmp, "r1_ascend.recipe.main_grpo") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert calls(node.tmp, "r1_ascend.recipe.main_grpo"), "the detached head launched the training"
    refused = node("restart")
    assert refused.returncode != 0
    assert f"the run's driver is still running on this node (pid {pid}" in refused.stderr
    stopped = node("stop")
    assert f"stopping the run's driver (pid {pid}" in stopped.stdout
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]


def test_a_worker_still_joined_says_so_and_does_nothing_else(node):
    env = {"NODE_IP": "127.0.0.3", "MASTER_ADDR": "127.0.0.2"}
    joined = node("start", **env)
    assert joined.returncode == 0, joined.stdout + joined.stderr
    assert "joined the Ray cluster at 127.0.0.2:6766" in joined.stdout
    restart = node("restart", **env)
    assert restart.returncode == 0, restart.stdout + restart.stderr
    assert "restart: this worker is still joined to 127.0.0.2:6766" in restart.stdout
    assert not calls(node.tmp, "r1_ascend.recipe.main_grpo"), "a worker never launches the training"
    node("stop", **env)


def _zombie() -> tuple[subprocess.Popen[bytes], str]:
    """A child of this process that ended and is not reaped (what an orphan stays where nothing reaps it), and the
    start time it had (field 22 of /proc/PID/stat), read while it ran."""
    child = subprocess.Popen(["sleep", "60"])
    started = Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    os.kill(child.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the killed child did not become a zombie"
        time.sleep(0.01)
    return child, started


def test_stop_takes_an_ended_ray_start_and_driver_nobody_reaped_as_ended(node):
    """Where nothing reaps orphans (a container whose PID 1 does not, a parent that became a subreaper), an ended
    ``ray start`` or driver stays a zombie and ``kill -0`` still finds it: stop must not wait 30 s for each."""
    ray, _ = _zombie()
    driver, started = _zombie()
    run_dir = node.tmp / "run"
    run_dir.mkdir()
    (run_dir / "ray-head-127.0.0.2.pid").write_text(f"{ray.pid}\n")
    (run_dir / "driver.pid").write_text(f"{driver.pid} {started}\n")
    began = time.monotonic()
    stopped = node("stop")
    took = time.monotonic() - began
    try:
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert "stopping the run's driver" not in stopped.stdout, "an ended driver is not stopped again"
        assert f"stopping ray start --block (pid {ray.pid})" not in stopped.stdout
        assert took < 10, f"stop waited {took:.1f} s on processes that had ended"
        assert not list(run_dir.glob("*.pid")), "the records of ended processes are removed"
    finally:
        ray.wait()
        driver.wait()
