"""``r1-ascend evaluate`` end to end with its generation backend replaced by one that answers as scripted: the
printed and written pass@1 / pass@k equal counts made by hand from the script; bad inputs fail clearly."""

from __future__ import annotations

import json
import re
import shutil
from fractions import Fraction
from pathlib import Path

import pytest

from r1_ascend.cli import main as r1_main
from r1_ascend.data.schema import write_parquet
from r1_ascend.evaluate import backends
from r1_ascend.evaluate import generation as gen
from r1_ascend.evaluate.cli import main

from .conftest import ScriptedBackend, boxed, row

STOP, LENGTH = gen.STOP, gen.LENGTH


def ok(text: str) -> gen.Completion:
    return gen.Completion(text, STOP, 12)


#: Per problem, 4 samples: correct ones are marked in the comments; the hand counts below follow from them.
SCRIPT = {
    "What is 2 + 3?": [ok(boxed("5")), ok(boxed("5")), ok(boxed("6")), ok("")],  # 2 (one empty)
    "What is 7 times 6?": [  # 1: wrong, no </think>, truncated with the right box, right
        ok(boxed("41")),
        ok("\\boxed{42}"),
        gen.Completion(boxed("42"), LENGTH, 64),
        ok(boxed("42")),
    ],
    "What is 10 - 4?": [ok(boxed("6"))] * 4,  # 4
    "What is 1/2 + 1/4?": [ok(boxed("\\frac{3}{4}")), ok(boxed("1")), ok(boxed("\\frac{3}{4}")), ok(boxed("2"))],  # 2
    "What is 9 squared?": [ok(boxed("18"))] * 4,  # 0
    "What is the square root of 16?": [ok(boxed("4")), ok(""), ok(""), ok(boxed("2"))],  # 1 (two empty)
}
N = 4


def hand_counts() -> dict[str, dict[str, float]]:
    """pass@1, pass@2, pass@4 per set from the correct counts above (malformed rows: 0), computed here by hand."""
    # aime24: 2, 1, 4 of 4 and the malformed row 0; pass@2 per problem = 1 - C(4-c,2)/C(4,2): 5/6, 1/2, 1, 0
    aime = {"pass@1": Fraction(2 + 1 + 4 + 0, 4 * 4), "2": (Fraction(5, 6) + Fraction(1, 2) + 1 + 0) / 4}
    aime["4"] = Fraction(3, 4)
    # amc: 2 and 0 of 4 and the malformed row 0
    amc = {"pass@1": Fraction(2, 4 * 3), "2": Fraction(5, 6) / 3, "4": Fraction(1, 3)}
    # math500: 1 of 4
    math = {"pass@1": Fraction(1, 4), "2": Fraction(1, 2), "4": Fraction(1)}
    return {
        name: {k: float(v) for k, v in d.items()} for name, d in (("aime24", aime), ("amc", amc), ("math500", math))
    }


def printed_rows(text: str) -> dict[str, list[str]]:
    rows = {}
    for line in text.splitlines():
        match = re.match(r"^\| `([^`]+)` \| (.*) \|$", line)
        if match:
            rows[match[1]] = [cell.strip() for cell in match[2].split("|")]
    return rows


@pytest.fixture
def scripted(monkeypatch: pytest.MonkeyPatch) -> list[ScriptedBackend]:
    """The transformers backend replaced by :class:`ScriptedBackend` with :data:`SCRIPT`; the list collects it."""
    made: list[ScriptedBackend] = []

    def factory(spec: gen.BackendSpec) -> ScriptedBackend:
        made.append(ScriptedBackend(spec.tokenizer, SCRIPT))
        return made[-1]

    monkeypatch.setitem(backends.BACKENDS, gen.TRANSFORMERS, factory)
    return made


def test_whole_command_counts_equal_the_hand_count(tiny_hf, val_parquet, scripted, tmp_path: Path, capsys) -> None:
    data = val_parquet()
    broken = tmp_path / "broken.parquet"  # one row without ground truth (aime24), one without prompt (amc)
    write_parquet(broken, [row("aime24", "What is 3 + 3?", answer=None), row("amc", "x", prompt=None)])
    out = tmp_path / "eval"
    argv = ["evaluate", str(tiny_hf), "--data", str(data), str(broken), "--output-dir", str(out)]
    argv += ["--samples", str(N), "--pass-k", "2", "--pass-k", "4", "--seed", "7", "--backend", "transformers"]
    assert r1_main(argv) == 0
    printed = capsys.readouterr().out
    expected = hand_counts()

    doc = json.loads((out / "evaluation.json").read_text(encoding="utf-8"))
    by_name = {s["name"]: s for s in doc["sets"]}
    assert list(by_name) == ["aime24", "amc", "math500"]
    assert {name: s["problems"] for name, s in by_name.items()} == {"aime24": 4, "amc": 3, "math500": 1}
    rows = printed_rows(printed)
    for name, want in expected.items():
        written = by_name[name]
        assert written["samples"] == N
        assert written["pass@1"] == pytest.approx(want["pass@1"])
        assert written["pass@k"] == pytest.approx({"2": want["2"], "4": want["4"]})
        # printed: set | problems | samples | pass@1 | pass@2 | pass@4 | correct | empty | truncated | malformed
        assert [float(cell) for cell in rows[name][2:5]] == pytest.approx(
            [want["pass@1"], want["2"], want["4"]], abs=5e-5
        )

    # what was counted wrong whatever the reward said is listed, in the JSON and the Markdown
    assert [(i["problem"], i["what"], i["samples"]) for i in by_name["aime24"]["counted_wrong"]] == [
        (0, "empty_response", [3]),
        (1, "truncated", [2]),
        (3, "malformed_row: no ground truth (reward_model.ground_truth missing or empty)", [0, 1, 2, 3]),
    ]
    assert [(i["problem"], i["what"]) for i in by_name["amc"]["counted_wrong"]] == [(2, "malformed_row: no prompt")]
    assert [(i["problem"], i["samples"]) for i in by_name["math500"]["counted_wrong"]] == [(0, [1, 2])]
    markdown = (out / "evaluation.md").read_text(encoding="utf-8")
    assert "- `amc` problem 2 (`broken.parquet:1`): malformed_row: no prompt (all samples)" in markdown
    assert "- `aime24` problem 1 (`prepared/val.parquet:1`)" not in markdown  # sources name the file, not its dir
    assert "- `aime24` problem 1 (`val.parquet:1`): truncated (samples 2)" in markdown

    # every sample is a line, the malformed rows' too; the reward's verdict is kept beside the count
    lines = [json.loads(line) for line in (out / "samples.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(lines) == N * (4 + 3 + 1)
    truncated = next(x for x in lines if x["reason"] == "truncated")
    assert (truncated["score"], truncated["reward"]["acc"], truncated["finish_reason"]) == (0.0, 1.0, "length")
    assert sum(x["score"] for x in lines if x["set"] == "aime24") == 7

    # the backend got the usable problems only, with the options and one seed per problem
    (backend,) = scripted
    assert [len(requests) for requests, _ in backend.calls] == [3, 2, 1]
    assert {options for _, options in backend.calls} == {gen.SamplingOptions(N, 0.6, 0.95, 32768)}
    assert [r.seed for r in backend.calls[0][0]] == [7, 7 + N, 7 + 2 * N]


def test_default_data_are_the_shipped_sets_prepared_on_the_fly(tiny_hf, monkeypatch, tmp_path: Path) -> None:
    answered = []

    class Wrong:
        name = "wrong"

        def generate(self, requests, options, progress):
            answered.extend(requests)
            return [[ok(boxed("no"))] * options.n for _ in requests]

    monkeypatch.setitem(backends.BACKENDS, gen.TRANSFORMERS, lambda spec: Wrong())
    out = tmp_path / "eval"
    assert (
        main([str(tiny_hf), "--output-dir", str(out), "--limit", "2", "--samples", "2", "--backend", "transformers"])
        == 0
    )
    doc = json.loads((out / "evaluation.json").read_text(encoding="utf-8"))
    assert [(s["name"], s["problems"], s["pass@1"], s["pass@k"]) for s in doc["sets"]] == [
        (name, 2, 0.0, {"2": 0.0}) for name in ("aime24", "amc", "math500")
    ]
    assert (out / "data" / "val.parquet").is_file()
    assert doc["data"] == [str((out / "data" / "val.parquet").resolve())]
    assert len(answered) == 6


def test_existing_results_are_kept_unless_overwrite(tiny_hf, val_parquet, scripted, tmp_path: Path, capsys) -> None:
    out = tmp_path / "eval"
    argv = [str(tiny_hf), "--data", str(val_parquet()), "--output-dir", str(out), "--samples", "4"]
    argv += ["--backend", "transformers"]
    assert main(argv) == 0
    first = (out / "evaluation.json").read_text(encoding="utf-8")
    capsys.readouterr()
    assert main(argv) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert (out / "evaluation.json").read_text(encoding="utf-8") == first
    assert main([*argv, "--overwrite"]) == 0


def megatron_dir(tmp_path: Path) -> Path:
    ckpt = tmp_path / "global_step_5" / "actor"
    (ckpt / "dist_ckpt").mkdir(parents=True)
    return tmp_path / "global_step_5"


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda tmp, hf: tmp / "absent", "does not exist; give the directory `r1-ascend convert-weights to-hf"),
        (lambda tmp, hf: megatron_dir(tmp), "is a Megatron checkpoint, not an HF one; export it first"),
        (lambda tmp, hf: (tmp / "global_step_5").mkdir() or (tmp / "global_step_5"), "has no config.json"),
    ],
)
def test_an_unusable_model_directory_is_named_with_the_fix(make, expected, tiny_hf, tmp_path: Path, capsys) -> None:
    model = make(tmp_path, tiny_hf)
    assert main([str(model), "--output-dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert str(model) in err
    assert expected in err
    assert not (tmp_path / "out").exists()


def test_incomplete_checkpoints_are_refused(tiny_hf, tmp_path: Path, capsys) -> None:
    no_index = tmp_path / "no-index"
    shutil.copytree(tiny_hf, no_index)
    (no_index / "model.safetensors.index.json").unlink()
    no_tokenizer = tmp_path / "no-tokenizer"
    shutil.copytree(tiny_hf, no_tokenizer)
    (no_tokenizer / "tokenizer.json").unlink()
    missing_shard = tmp_path / "missing-shard"
    shutil.copytree(tiny_hf, missing_shard)
    next(missing_shard.glob("*.safetensors")).unlink()
    for model, expected in (
        (no_index, "interrupted `r1-ascend convert-weights to-hf`"),
        (no_tokenizer, "has no tokenizer"),
        (missing_shard, "missing weight file"),
    ):
        assert main([str(model), "--output-dir", str(tmp_path / "out")]) == 2
        assert expected in capsys.readouterr().err


def test_an_unreadable_data_file_is_named_with_the_fix(tiny_hf, tmp_path: Path, capsys) -> None:
    bad = tmp_path / "val.parquet"
    bad.write_text("not parquet", encoding="utf-8")
    assert main([str(tiny_hf), "--data", str(bad), "--output-dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"--data {bad} is not readable parquet" in err
    assert "r1-ascend prepare-data --val" in err


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--samples", "4", "--pass-k", "8"], "--pass-k 8 is more than the 4 samples"),
        (["--samples", "0"], "expected a positive integer"),
        (["--top-p", "1.5"], "expected a number in (0, 1]"),
        (["--temperature", "-1"], "expected a temperature >= 0"),
        (["--vllm-kwargs", "[1]"], "expected a JSON object"),
    ],
)
def test_bad_options_are_usage_errors(argv: list[str], expected: str, capsys) -> None:
    assert main(["model", *argv]) == 2
    assert expected in capsys.readouterr().err


def test_a_row_the_chat_template_cannot_render_is_kept_as_malformed() -> None:
    from jinja2 import TemplateError

    from r1_ascend.data.template import build_prompt
    from r1_ascend.evaluate.problems import Problem
    from r1_ascend.evaluate.run import render

    class Tokenizer:
        def apply_chat_template(self, messages, add_generation_prompt, tokenize):
            if "bad" in messages[-1]["content"]:
                raise TemplateError("Conversation roles must alternate")
            return messages[-1]["content"]

        def encode(self, text, add_special_tokens):
            return [len(text)]

    problems = [Problem("amc", i, f"v.parquet:{i}", build_prompt(text), "1") for i, text in enumerate(["ok", "bad"])]
    kept, ids = render(Tokenizer(), problems)
    assert [p.malformed for p in kept] == [
        None,
        "the chat template cannot render the prompt (Conversation roles must alternate)",
    ]
    assert ids == {0: [2]}
