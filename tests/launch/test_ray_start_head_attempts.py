"""scripts/ray_start_npu.sh tries the head's `ray start` again when it exits before Ray is up, and says why.

`ray start --head` gives up when its GCS answers too late (a loaded node); the script then shows the end of Ray's
log, stops what that start left, and starts again, up to RAY_HEAD_START_ATTEMPTS. `ray` here is a stand-in script
that fails a chosen number of times with a line of its own and then behaves as `ray start --block` does (prints
Ray's startup line and blocks), and the cluster check after it is one that reports an incomplete cluster: only the
script's handling is under test, Ray's own start is in test_ray_start.py.
"""

from __future__ import annotations

import os
import subprocess
import textwrap
import uuid
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "ray_start_npu.sh"

FAKE_RAY = textwrap.dedent(
    """\
    #!/usr/bin/env bash
    set -euo pipefail
    calls="$(( $(cat "${{FAKE_RAY_CALLS}}" 2>/dev/null || echo 0) + 1 ))"
    echo "${{calls}}" > "${{FAKE_RAY_CALLS}}"
    if (( calls <= {failures} )); then
        echo "start ${{calls}}: the GCS did not answer in time ({tag})"
        exit 1
    fi
    echo "Ray runtime started."
    echo "$$" >> "${{FAKE_RAY_CALLS}}.pids"
    exec sleep 600
    """
)


def _run_head(tmp_path: Path, *, failures: int, attempts: int) -> tuple[subprocess.CompletedProcess[str], str, int]:
    tag = uuid.uuid4().hex
    fake = tmp_path / "ray"
    fake.write_text(FAKE_RAY.format(failures=failures, tag=tag))
    fake.chmod(0o755)
    incomplete = tmp_path / "python"
    # the head's token for the shared-directory check is written; the cluster check then reports it incomplete
    incomplete.write_text(
        '#!/usr/bin/env bash\n[[ "$4" != token ]] || exit 0\necho "the cluster is incomplete" >&2\nexit 1\n'
    )
    incomplete.chmod(0o755)
    calls = tmp_path / "calls"
    env = {
        **os.environ,
        "RAY": str(fake),
        "PYTHON": str(incomplete),
        "FAKE_RAY_CALLS": str(calls),
        "NNODES": "1",
        "NPUS_PER_NODE": "16",
        "NODE_IP": "127.0.0.2",
        "MASTER_ADDR": "127.0.0.2",
        "RAY_TEMP_DIR": str(tmp_path / "ray-temp"),
        "R1_ASCEND_RUN_DIR": str(tmp_path / "run"),
        "OUTPUT_DIR": str(tmp_path / "outputs"),
        "R1_ASCEND_PREFLIGHT_CMD": "",
        "RAY_HEAD_START_ATTEMPTS": str(attempts),
        "RAY_HEAD_START_TIMEOUT": "60",
    }
    try:
        head = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=120)
    finally:
        subprocess.run(["bash", str(SCRIPT), "stop"], env=env, capture_output=True, timeout=90, check=False)
    return head, tag, int(calls.read_text()) if calls.exists() else 0


def _left_running(tmp_path: Path) -> list[int]:
    """The started stand-ins still running after the script's stop."""
    started = tmp_path / "calls.pids"
    pids = [int(pid) for pid in started.read_text().split()] if started.exists() else []
    return [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]


@pytest.mark.parametrize("attempts", [1, 2, 3])
def test_a_head_that_keeps_exiting_fails_after_the_attempts_with_the_end_of_rays_log(tmp_path, attempts):
    head, tag, calls = _run_head(tmp_path, failures=attempts, attempts=attempts)
    assert head.returncode == 1
    assert calls == attempts
    assert f"ray start --head exited {attempts} times" in head.stderr
    for call in range(1, attempts + 1):
        assert f"attempt {call} of {attempts}) exited" in head.stderr
        assert f"start {call}: the GCS did not answer in time ({tag})" in head.stderr
    assert "started Ray head" not in head.stdout
    assert _left_running(tmp_path) == []


def test_a_head_that_exits_once_is_started_again(tmp_path):
    head, tag, calls = _run_head(tmp_path, failures=1, attempts=2)
    assert calls == 2
    assert f"start 1: the GCS did not answer in time ({tag})" in head.stderr
    assert "started Ray head" in head.stdout  # the second start came up; the cluster check followed
    assert "the Ray cluster did not assemble" in head.stderr
    assert (tmp_path / "calls.pids").read_text().split() != []
    assert "ray start --head exited 2 times" not in head.stderr
    assert _left_running(tmp_path) == []


def test_the_attempts_must_be_a_positive_integer(tmp_path):
    head, _, calls = _run_head(tmp_path, failures=0, attempts=0)
    assert head.returncode == 1
    assert "RAY_HEAD_START_ATTEMPTS must be a positive integer, got '0'" in head.stderr
    assert calls == 0
