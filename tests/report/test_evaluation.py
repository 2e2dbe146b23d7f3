"""``r1-ascend report`` shows ``r1-ascend evaluate`` results beside the training curves: an ``evaluation.json`` in
the run directory, or one named with ``--evaluation``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from r1_ascend.data.template import build_prompt
from r1_ascend.evaluate import tables
from r1_ascend.evaluate.problems import Problem
from r1_ascend.evaluate.scoring import TRUNCATED, SampleResult
from r1_ascend.report.cli import main

LOG = "step:1 - timing_s/step:100.0 - perf/throughput:50.0\nstep:2 - timing_s/step:110.0\n"


def evaluation(model: str) -> dict:
    """aime24: two problems, 2 and 0 of 2 samples correct (one truncated): pass@1 0.5, pass@2 0.5."""
    problems = [Problem("aime24", i, f"val.parquet:{i}", build_prompt(f"p{i}"), "1") for i in range(2)]
    right = SampleResult(0, "r", True, "", {"acc": 1.0})
    wrong = SampleResult(1, "w", False, TRUNCATED, {"acc": 0.0}, "length", 9)
    run = tables.SetRun(
        "aime24", [tables.ProblemRun(problems[0], [right, right]), tables.ProblemRun(problems[1], [wrong, wrong])]
    )
    meta = {"model": model, "backend": "vllm", "settings": {"samples": 2, "temperature": 0.6, "top_p": 0.95}}
    return tables.document([run], n=2, ks=(2,), meta=meta)


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    (run / "train.log").write_text(LOG, encoding="utf-8")
    return run


def test_an_evaluation_in_the_run_directory_gets_its_section(run_dir: Path, tmp_path: Path, capsys) -> None:
    (run_dir / "evaluation" / "step2").mkdir(parents=True)
    (run_dir / "evaluation" / "step2" / "evaluation.json").write_text(json.dumps(evaluation("/ckpt/step2")))
    out = tmp_path / "out"
    assert main([str(run_dir), "--out", str(out), "--no-figures"]) == 0
    report = (out / "report.md").read_text(encoding="utf-8")
    section = report[report.index("## Evaluation") :]
    assert "### `/ckpt/step2`" in section
    assert "| `aime24` | 2 | 2 | 0.5000 | 0.5000 | 2/4 | 0 | 2 | 0 |" in section
    assert "1 problem(s), listed in its evaluation.md" in section
    assert report.index("## Validation") < report.index("## Evaluation")
    assert "evaluation: " in capsys.readouterr().out


def test_a_named_evaluation_is_shown_and_a_bad_one_is_an_error(run_dir: Path, tmp_path: Path, capsys) -> None:
    named = tmp_path / "elsewhere.json"
    named.write_text(json.dumps(evaluation("/ckpt/final")))
    out = tmp_path / "out"
    assert main([str(run_dir), "--out", str(out), "--no-figures", "--evaluation", str(named)]) == 0
    assert "### `/ckpt/final`" in (out / "report.md").read_text(encoding="utf-8")
    capsys.readouterr()
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    assert main([str(run_dir), "--out", str(out), "--evaluation", str(broken)]) == 2
    assert f"--evaluation {broken} is not valid JSON" in capsys.readouterr().err
    assert main([str(run_dir), "--out", str(out), "--evaluation", str(tmp_path / "absent.json")]) == 2


def test_a_found_file_that_is_not_an_evaluation_is_listed_not_hidden(run_dir: Path, tmp_path: Path) -> None:
    (run_dir / "evaluation.json").write_text(json.dumps({"accuracy": 0.3}))
    out = tmp_path / "out"
    assert main([str(run_dir), "--out", str(out), "--no-figures"]) == 0
    report = (out / "report.md").read_text(encoding="utf-8")
    assert "`../run/evaluation.json`: skipped, " in report
    assert "not an r1-ascend evaluate result" in report


def test_no_evaluation_no_section(run_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert main([str(run_dir), "--out", str(out), "--no-figures"]) == 0
    assert "## Evaluation" not in (out / "report.md").read_text(encoding="utf-8")
