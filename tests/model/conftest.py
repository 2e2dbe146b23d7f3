"""One converted smoke-model checkpoint per session, made as the rehearsal makes it: the quickstart's FP8 -> BF16 ->
Megatron chain, plus the tiny tokenizer; and ``r1-ascend check-model`` run in its own process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def converted(quickstart_weights: Path) -> Path:
    """The session's quickstart checkpoint (root conftest.py), made as the rehearsal makes it."""
    return quickstart_weights


def _run_check(weights: Path, *extra: str, env: dict[str, str] | None = None) -> tuple[int, dict, str]:
    out = Path(tempfile.mkdtemp()) / "gap.json"
    cmd = [sys.executable, "-m", "r1_ascend.weights.model_check", "--cpu", "--hf-dir", str(weights / "hf-bf16")]
    cmd += ["--json", str(out)]
    from r1_ascend.rehearse.cluster import with_site  # torch_npu / MindSpeed stand-ins, as in the rehearsal

    full_env = {**with_site(os.environ), **(env or {})}
    done = subprocess.run([*cmd, *extra], capture_output=True, text=True, check=False, env=full_env, timeout=900)
    result = json.loads(out.read_text(encoding="utf-8")) if out.is_file() else {}
    return done.returncode, result, done.stdout + done.stderr


@pytest.fixture
def run_check() -> Callable[..., tuple[int, dict, str]]:
    """check-model on a checkpoint pair, in its own process (it rewires megatron-core's device calls and
    initialises torch.distributed): (exit status, the JSON result, stdout + stderr)."""
    return _run_check
