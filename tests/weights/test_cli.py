from __future__ import annotations

import json
from pathlib import Path

import pytest

from r1_ascend.cli import main as r1_main
from r1_ascend.weights.cli import main


@pytest.mark.slow
def test_make_tiny_then_all_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert r1_main(["convert-weights", "make-tiny", str(tmp_path / "fp8")]) == 0
    assert main(["all", str(tmp_path / "fp8"), str(tmp_path / "out"), "--ep", "2", "--verify", "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert f"dist_checkpointing_path={tmp_path / 'out' / 'mcore'}" in printed
    cfg = json.loads((tmp_path / "out" / "hf-bf16" / "config.json").read_text())
    assert cfg["num_nextn_predict_layers"] == 0
    assert "quantization_config" not in cfg
    assert (tmp_path / "out" / "mcore" / "metadata.json").exists()
    # a second run finds everything done
    assert main(["all", str(tmp_path / "fp8"), str(tmp_path / "out"), "--ep", "2", "--quiet"]) == 0


def test_errors_are_reported_not_raised(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fp8-to-bf16", str(tmp_path / "missing"), str(tmp_path / "out"), "--quiet"]) == 1
    assert "is not a directory" in capsys.readouterr().err


@pytest.mark.slow
def test_all_resumes_after_a_kill_in_the_middle(tiny_fp8, tmp_path: Path) -> None:
    """The one-command path: `all` killed mid-way through the FP8 -> BF16 step, rerun, ends with verified outputs."""
    import signal
    import subprocess
    import sys

    out = tmp_path / "out"
    code = "import sys; from r1_ascend.weights.cli import main; sys.exit(main(sys.argv[1:]))"
    args = ["all", str(tiny_fp8.path), str(out), "--ep", "2", "--quiet"]
    cmd = [sys.executable, "-c", code, *args]
    faults = [sys.executable, str(Path(__file__).with_name("faults.py")), "--kill-after-tensors", "60", "--"]
    killed = subprocess.run([*faults, *args], capture_output=True, check=False)
    assert killed.returncode == -signal.SIGKILL
    assert not (out / "mcore").exists()
    resumed = subprocess.run([*cmd, "--verify"], capture_output=True, text=True, check=False)
    assert resumed.returncode == 0, resumed.stderr
    assert "already complete" in resumed.stderr  # finished shards were kept, not redone
    cfg = json.loads((out / "hf-bf16" / "config.json").read_text())
    assert cfg["num_nextn_predict_layers"] == 0
    assert "quantization_config" not in cfg
    assert (out / "mcore" / "metadata.json").exists()
