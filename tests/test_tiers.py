"""The suite's scheduling in conftest.py: its list names real modules (a renamed module would silently leave it),
and parallel test workers do not oversubscribe the cores."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import conftest

REPO = Path(__file__).resolve().parents[1]


def test_every_machine_module_exists() -> None:
    missing = sorted(m for m in conftest.MACHINE_MODULES if not (REPO / m).is_file())
    assert missing == []


@pytest.mark.skipif(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) < 2, reason="one test worker: all cores")
def test_parallel_workers_share_the_cores() -> None:
    import torch

    workers = int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    assert torch.get_num_threads() * workers <= max(workers, len(os.sched_getaffinity(0)))
