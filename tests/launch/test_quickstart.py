"""`r1-ascend quickstart` end to end on the shipped sample and a tiny model (real data prep and conversion)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from r1_ascend.launch import quickstart


@pytest.mark.slow
def test_quickstart_runs_end_to_end_and_prints_the_launch_command(tmp_path):
    out = tmp_path / "qs"
    cmd = [sys.executable, "-m", "r1_ascend.cli", "quickstart", "--output-dir", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    for stage in ("[1/5]", "[2/5]", "[3/5]", "[4/5]", "[5/5]"):
        assert f"{stage} " in done.stdout
    assert "preflight grpo_deepseekv3_smoke: done" in done.stdout
    assert "0 error(s), 0 warning(s), 0 skipped" in done.stdout
    assert "bash scripts/run_grpo_smoke_npu.sh" in done.stdout
    assert (out / "weights" / "mcore" / "metadata.json").is_file()
    assert (out / "weights" / "hf-bf16" / "tokenizer.json").is_file()
    assert (out / "data" / "train.parquet").is_file()
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=300)  # idempotent rerun
    assert again.returncode == 0, again.stdout + again.stderr
    assert "reused" in again.stdout


@pytest.fixture
def stubbed_stages(monkeypatch):
    """The stages replaced by no-ops, so the decision after the preflight can be tested alone."""
    for name in ("prepare_data", "make_checkpoint", "convert", "add_tokenizer"):
        monkeypatch.setattr(quickstart, name, lambda *args, **kwargs: "")

    def set_preflight(blocking):
        monkeypatch.setattr(quickstart, "preflight", lambda paths: (blocking, "summary"))

    return set_preflight


def test_launch_command_is_offered_as_runnable_only_when_nothing_blocks(stubbed_stages, tmp_path, capsys):
    stubbed_stages([])
    assert quickstart.main(["--output-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "all stages passed" in out
    assert "bash scripts/run_grpo_smoke_npu.sh" in out


@pytest.mark.parametrize(
    "blocking",
    [
        ["model_config: /m has no tokenizer file"],  # a warning
        ["attention_heads: skipped: needs the model's config.json"],  # a check that could not run
    ],
)
def test_warnings_or_skipped_checks_say_what_is_missing_instead(stubbed_stages, tmp_path, capsys, blocking):
    stubbed_stages(blocking)
    assert quickstart.main(["--output-dir", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert "all stages passed" not in captured.out
    assert "not ready to launch" in captured.err
    assert blocking[0] in captured.err
