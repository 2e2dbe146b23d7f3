"""``r1-ascend evaluate`` end to end on the CPU backend: transformers samples the tiny DeepSeek-V3-shaped checkpoint
after its round trip through Megatron and ``to-hf``; every written sample is scored again here with the recipe's
``compute_score`` and the per-set pass@1 / pass@k, printed and written, must equal that count."""

from __future__ import annotations

import itertools
import json
import re
from fractions import Fraction
from pathlib import Path

import pytest

from r1_ascend.cli import main
from r1_ascend.recipe.deepscaler_reward import compute_score

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning"),  # to-hf reads DCP in-process
]

N = 3  # samples per problem
ROWS = 2  # problems per set
MAX_NEW = 8


def any_correct_share(flags: list[bool], k: int) -> Fraction:
    """pass@k of one problem by counting its k-subsets that hold a correct sample."""
    subsets = list(itertools.combinations(flags, k))
    return Fraction(sum(any(s) for s in subsets), len(subsets))


def test_transformers_backend_end_to_end_matches_an_independent_rescoring(
    tiny_export: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "eval"
    argv = ["evaluate", str(tiny_export), "--output-dir", str(out), "--backend", "transformers", "--limit", str(ROWS)]
    argv += ["--samples", str(N), "--max-new-tokens", str(MAX_NEW), "--pass-k", "2", "--pass-k", str(N)]
    assert main(argv) == 0
    done = capsys.readouterr()
    assert re.search(rf"aime24: {ROWS * N}/{ROWS * N} samples \(100%\), \d+m\d\ds elapsed", done.err)

    lines = [json.loads(line) for line in (out / "samples.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(lines) == 3 * ROWS * N
    assert all(line["finish_reason"] in ("stop", "length") and line["tokens"] <= MAX_NEW for line in lines)
    flags: dict[str, dict[int, list[bool]]] = {}
    for line in lines:
        reward = compute_score(
            data_source=line["set"], solution_str=line["response"], ground_truth=line["ground_truth"], extra_info={}
        )
        assert reward == line["reward"]
        correct = reward["acc"] == 1.0 and line["finish_reason"] != "length" and bool(line["response"].strip())
        assert line["score"] == float(correct)
        flags.setdefault(line["set"], {}).setdefault(line["problem"], []).append(correct)

    doc = json.loads((out / "evaluation.json").read_text(encoding="utf-8"))
    printed = {m[1]: m[2].split(" | ") for m in re.finditer(r"^\| `(\w+)` \| (.*) \|$", done.out, re.M)}
    assert list(flags) == [s["name"] for s in doc["sets"]] == list(printed) == ["aime24", "amc", "math500"]
    for written in doc["sets"]:
        problems = flags[written["name"]]
        pass_1 = sum(Fraction(sum(f), N) for f in problems.values()) / len(problems)
        pass_k = {k: sum(any_correct_share(f, k) for f in problems.values()) / len(problems) for k in (2, N)}
        assert written["pass@1"] == pytest.approx(float(pass_1))
        assert written["pass@k"] == pytest.approx({str(k): float(v) for k, v in pass_k.items()})
        assert [p["scores"] for p in written["per_problem"]] == [[float(x) for x in f] for f in problems.values()]
        cells = printed[written["name"]]  # problems | samples | pass@1 | pass@2 | pass@3 | ...
        assert [float(c) for c in cells[2:5]] == pytest.approx([pass_1, pass_k[2], pass_k[N]], abs=5e-5)
