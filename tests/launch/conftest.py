"""Shared fixtures: a complete, valid input set for the smoke configuration (model dir, dist checkpoint, data)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from r1_ascend.launch.smoke_model import sample_path, smoke_model_config
from r1_ascend.ports import unused_local_port
from r1_ascend.rehearse.cluster import delete_netns, make_netns


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
