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
