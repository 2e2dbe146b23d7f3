"""Shared fixtures: a complete, valid input set for the smoke configuration (model dir, dist checkpoint, data)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from r1_ascend.launch.smoke_model import sample_path, smoke_model_config
from r1_ascend.ports import unused_local_port
from r1_ascend.rehearse.cluster import delete_netns, make_netns
from r1_ascend.rehearse.leftovers import run_processes
from r1_ascend.rehearse.process_faults import with_descendants


def write_model(path: Path, config: dict) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    (path / "tokenizer.json").write_text("{}")
    return path


@pytest.fixture(scope="session")
def model_factory():
    """``make(path, **config_overrides) -> Path``: an HF model directory with the smoke config (+ overrides)."""

    def make(path: Path, **overrides) -> Path:
        return write_model(path, smoke_model_config(**overrides))

    return make


@dataclass(frozen=True)
class SmokeInputs:
    model: Path
    ckpt: Path
    data: Path

    def overrides(self, **paths: str) -> list[str]:
        model = paths.get("model", str(self.model))
        ckpt = paths.get("ckpt", str(self.ckpt))
        train = paths.get("train", str(self.data / "train.parquet"))
        val = paths.get("val", str(self.data / "val.parquet"))
        return [
            f"actor_rollout_ref.model.path={model}",
            f"actor_rollout_ref.actor.megatron.dist_checkpointing_path={ckpt}",
            f"data.train_files={train}",
            f"data.val_files={val}",
        ]


@pytest.fixture(scope="session")
def smoke_inputs(tmp_path_factory) -> SmokeInputs:
    from r1_ascend.data.prepare import prepare, prepare_val

    root = tmp_path_factory.mktemp("smoke")
    model = write_model(root / "model", smoke_model_config())
    ckpt = root / "mcore"
    ckpt.mkdir()
    # The file set of a Megatron torch_dist checkpoint (preflight checks presence and metadata, not tensors;
    # the quickstart test converts a real one).
    (ckpt / "metadata.json").write_text(json.dumps({"sharded_backend": "torch_dist", "sharded_backend_version": 1}))
    (ckpt / ".metadata").write_bytes(b"\x80")
    (ckpt / "common.pt").write_bytes(b"\x80")
    (ckpt / "__0_0.distcp").write_bytes(b"\x80")
    prepare([sample_path()], root / "data")
    prepare_val(root / "data")
    return SmokeInputs(model, ckpt, root / "data")


@pytest.fixture(scope="session")
def weights(quickstart_weights: Path) -> Path:
    """One converted quickstart checkpoint for every rehearsal of the session that does not test the conversion
    itself (``rehearse --weights``; root conftest.py): a conversion per run cost a minute or more each."""
    return quickstart_weights


def _reaped_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


@pytest.fixture
def reaped_pid() -> Callable[[], int]:
    """``reaped_pid()`` -> the pid of a process that ran and was reaped: no longer alive (a worker that is gone)."""
    return _reaped_pid


@pytest.fixture
def free_port() -> Callable[[], int]:
    """``free_port()`` -> a TCP port on 127.0.0.1 nothing listens on right now (Ray ports in the cluster tests)."""
    return unused_local_port


@pytest.fixture
def netns() -> Iterator[list[str]]:
    """The command prefix that runs a process in a fresh loopback-only network namespace ([] if unavailable)."""
    prefix, name = make_netns()
    try:
        yield prefix
    finally:
        if name is not None:
            delete_netns(name)


def rehearse_cli(*args: str, timeout: float = 1200) -> subprocess.CompletedProcess:
    """``r1-ascend rehearse ARGS`` as a user runs it, its output captured; ``timeout`` seconds at most."""
    cmd = [sys.executable, "-m", "r1_ascend.cli", "rehearse", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)


def other_workers_processes() -> set[int]:
    """Every live process under the other pytest-xdist workers of this test run (the other machine lane's rehearsals,
    Ray clusters and stand-in workers, while its tests hold them). None of them can be a process of a run this worker
    started: those stay under this worker, or are orphaned to init. Empty outside pytest-xdist."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return set()
    me = psutil.Process()
    parent = me.parent()
    if parent is None:
        return set()
    return with_descendants({p.pid for p in parent.children() if p.pid != me.pid})


def assert_nothing_left(summary: dict, began: float) -> None:
    """Nothing of the rehearsal runs anywhere on the machine: no process whose command line, environment or open
    files name its Ray temp dir (a worker orphaned to PID 1 with what it forked included), and no Ray worker started
    since ``began`` that no other Ray session claims. A Ray worker the other machine lane's tests still hold is not
    counted as unclaimed: a worker of theirs that has not yet opened its session logs would look so for a moment."""
    left = run_processes(summary["ray_temp_dir"], began)
    if left:
        others = other_workers_processes()
        left = [process for process in left if process.pid not in others]
    assert left == [], "processes of the rehearsal left:\n" + "\n".join(p.describe() for p in left)
    if summary["netns"]:
        names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
        assert summary["netns"] not in names


@pytest.fixture
def rehearse() -> Callable[..., subprocess.CompletedProcess]:
    """``rehearse(*args, timeout=1200)``: ``r1-ascend rehearse ARGS``, its output captured."""
    return rehearse_cli


def temp_dir_announced(stdout: str) -> str:
    """The Ray temp dir a rehearsal announced on its output (``cluster: ... Ray temp dir /tmp/r1rh-...``)."""
    found = re.search(r"Ray temp dir (\S+)", stdout)
    assert found, f"the rehearsal did not announce its Ray temp dir: {stdout[-2000:]}"
    return found.group(1)


@pytest.fixture
def announced_temp_dir() -> Callable[[str], str]:
    """``announced_temp_dir(stdout)``: the Ray temp dir a rehearsal's output announced (for ``nothing_left``)."""
    return temp_dir_announced


@pytest.fixture
def nothing_left() -> Callable[[dict, float], None]:
    """``nothing_left(summary, began)``: fails if anything of that rehearsal still runs on the machine."""
    return assert_nothing_left


@pytest.fixture
def fault_run(weights: Path) -> Callable[[Path, str], dict]:
    """``fault_run(out, name)``: ``rehearse --fault NAME`` on the session's converted weights; it must pass (its own
    verdicts) and leave nothing behind. Returns its summary."""

    def run(out: Path, name: str) -> dict:
        began = time.time()
        done = rehearse_cli("--fault", name, "--output-dir", str(out), "--weights", str(weights))
        assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]
        summary = json.loads((out / f"summary-{name}.json").read_text())
        assert_nothing_left(summary, began)
        return summary

    return run
