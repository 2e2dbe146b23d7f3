"""Validation-set mode: one data_source per set, combined or per-set files, per-set de-duplication."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from r1_ascend.data import cli as data_cli
from r1_ascend.data import prepare as prep
from r1_ascend.data.valsets import SHIPPED_VAL_SETS, VAL_DIR


def _source_rows(name: str) -> list[dict]:
    return json.loads((VAL_DIR / SHIPPED_VAL_SETS[name]).read_text(encoding="utf-8"))


def test_combined_val_parquet_keeps_each_set_as_its_data_source(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert data_cli.main(["--val", "--output-dir", str(out)]) == 0
    rows = pq.read_table(out / "val.parquet").to_pylist()
    sizes = {name: len(_source_rows(name)) for name in SHIPPED_VAL_SETS}
    assert Counter(r["data_source"] for r in rows) == sizes
    assert sizes == {"aime24": 30, "amc": 83, "math500": 500}
    # source order, index unique across the combined file, split "test"
    assert [r["extra_info"]["index"] for r in rows] == list(range(len(rows)))
    assert {r["extra_info"]["split"] for r in rows} == {"test"}
    amc = [r for r in rows if r["data_source"] == "amc"]
    assert [r["reward_model"]["ground_truth"] for r in amc] == [str(int(x["answer"])) for x in _source_rows("amc")]
    math500 = [r for r in rows if r["data_source"] == "math500"]
    assert json.loads(math500[0]["extra_info"]["extra_fields"])["unique_id"] == _source_rows("math500")[0]["unique_id"]
    summary = json.loads((out / "val_summary.json").read_text(encoding="utf-8"))
    assert summary["per_data_source"] == sizes
    assert summary["outputs"] == ["val.parquet", "val_summary.json"]


def test_per_set_layout_and_chosen_sets(tmp_path: Path) -> None:
    out = tmp_path / "out"
    summary = prep.prepare_val(out, val_sets=["aime24", "amc"], layout="per-set")
    assert summary.written == {"val_aime24.parquet": 30, "val_amc.parquet": 83}
    assert {r["data_source"] for r in pq.read_table(out / "val_amc.parquet").to_pylist()} == {"amc"}
    assert not (out / "val.parquet").exists()


def test_own_val_file_and_duplicates_only_within_a_set(tmp_path: Path) -> None:
    own = tmp_path / "mine.jsonl"
    shared_problem = _source_rows("aime24")[0]
    own.write_text(
        json.dumps(shared_problem) + "\n" + json.dumps(shared_problem) + "\n" + '{"problem": "x"}\n', encoding="utf-8"
    )
    out = tmp_path / "out"
    summary = prep.prepare_val(out, val_sets=["aime24", f"mine={own}"])
    assert summary.per_data_source == {"aime24": 30, "mine": 1}  # the copy in "mine" still counts for "mine"
    assert summary.duplicates == 1
    assert summary.rejected == {"missing_answer": 1}
    assert (out / "val_rejects.jsonl").exists()
    assert (out / "val_duplicates.jsonl").exists()


def test_val_and_train_outputs_share_a_directory(sample_path: Path, tmp_path: Path) -> None:
    prep.prepare([sample_path], tmp_path, test_size=8)
    prep.prepare_val(tmp_path)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["summary.json", "test.parquet", "train.parquet", "val.parquet", "val_summary.json"]


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"val_sets": ["aime25"]}, "unknown validation set 'aime25'"),
        ({"val_sets": ["amc", "amc"]}, "must be unique"),
        ({"val_sets": ["=x.json"]}, "has no name"),
        ({"layout": "split"}, "unknown validation layout"),
    ],
)
def test_val_option_errors(kwargs: dict, needle: str, tmp_path: Path) -> None:
    with pytest.raises(prep.DataError, match=needle):
        prep.prepare_val(tmp_path, **kwargs)


def test_val_mode_rejects_input_flag(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        data_cli.main(["--val", "--input", "x.json", "--output-dir", str(tmp_path)])
    assert "--val-set NAME=PATH" in capsys.readouterr().err
