"""The rehearsal's toy task: its reward on written and generated responses, its parquet through verl's RLHFDataset.

The math reward's own tests (tests/reward) keep covering the real run's reward; these cover the reward and data
the rehearsal trains on instead (docs/rehearsal.md "Toy task").
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import datasets
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from r1_ascend.data.schema import SCHEMA
from r1_ascend.data.template import DEEPSEEK_ASSISTANT, DEEPSEEK_EOS, render_deepseek_v3
from r1_ascend.rehearse import toy_task
from r1_ascend.rehearse.toy_task import LEAD_CHARS, PRED_MAX_CHARS, SCORE_KEYS, compute_score

pytestmark = pytest.mark.machine

REPO_ROOT = Path(__file__).resolve().parents[2]
TOY_TASK_FILE = REPO_ROOT / "src" / "r1_ascend" / "rehearse" / "toy_task.py"


def _score(response: object, truth: object = "7") -> dict:
    return compute_score(toy_task.DATA_SOURCE, response, truth, {"index": 0})


class TestReward:
    """Score 1 exactly when a digit occurs in the first LEAD_CHARS characters; the other keys describe it."""

    @pytest.mark.parametrize(
        ("response", "score", "pred", "exact", "reason"),
        [
            ("7", 1.0, "7", 1.0, ""),
            ("7 is the answer", 1.0, "7", 1.0, ""),
            (" 12 apples", 1.0, "12", 0.0, ""),
            ("It is 7.", 1.0, "7", 1.0, ""),  # the digit is the 7th character
            ("answer:7", 1.0, "7", 1.0, ""),  # the 8th
            ("answer: 7", 0.0, "", 0.0, "no_leading_number"),  # the 9th: too late
            ("seven", 0.0, "", 0.0, "no_leading_number"),
            ("", 0.0, "", 0.0, "empty_response"),
            ("007", 1.0, "007", 1.0, ""),  # the same integer
            ("٧", 0.0, "", 0.0, "no_leading_number"),  # Arabic-Indic seven: only ASCII digits count
            ("\ufffd\ufffd8", 1.0, "8", 0.0, ""),  # undecodable bytes decode to U+FFFD, which is not a digit
            (f"{DEEPSEEK_EOS}7", 0.0, "", 0.0, "no_leading_number"),  # special-token text counts as text
        ],
    )
    def test_written_responses(self, response: str, score: float, pred: str, exact: float, reason: str) -> None:
        result = _score(response, "7")
        assert result == {"score": score, "acc": score, "exact": exact, "pred": pred, "fail_reason": reason}

    def test_leading_number_is_read_to_its_end_within_a_bound(self) -> None:
        """``pred`` is the whole leading number, cut at PRED_MAX_CHARS digits; a huge response costs nothing more."""
        digits = "1234567890" * 100_000
        result = _score(digits, digits)
        assert result["pred"] == digits[:PRED_MAX_CHARS]
        assert result["score"] == 1.0
        assert result["exact"] == 0.0
        assert _score(digits[:PRED_MAX_CHARS] + "0", digits[:PRED_MAX_CHARS])["exact"] == 0.0  # cut, so not exact
        assert _score("0" * PRED_MAX_CHARS, "0")["exact"] == 1.0
        assert _score("x" * 1_000_000)["fail_reason"] == "no_leading_number"

    @pytest.mark.parametrize("response", [None, 7, 7.0, ["7"], object()])
    def test_non_text_responses_score_zero(self, response: object) -> None:
        assert _score(response) == {"score": 0.0, "acc": 0.0, "exact": 0.0, "pred": "", "fail_reason": "empty_response"}

    def test_bytes_are_decoded_with_replacement(self) -> None:
        assert _score(b"\xff\xfe42")["pred"] == "42"
        assert _score(bytearray(b"\x80 7"))["score"] == 1.0

    @pytest.mark.parametrize("truth", [None, "", "seven", "٧", "-7", ["7"]])
    def test_ground_truths_that_are_not_digit_strings_never_match(self, truth: object) -> None:
        result = _score("7", truth)
        assert (result["score"], result["exact"]) == (1.0, 0.0)

    def test_unknown_options_are_refused(self) -> None:
        with pytest.raises(TypeError, match="no options"):
            compute_score(toy_task.DATA_SOURCE, "7", "7", None, accuracy_weight=1.0)

    @settings(max_examples=300, deadline=None)
    @given(st.text(max_size=200), st.sampled_from(["0", "7", "18", "198"]))
    def test_any_text_follows_the_definition(self, response: str, truth: str) -> None:
        """Never raises; same keys; 0/1; the score is exactly "an ASCII digit among the first LEAD_CHARS"."""
        result = _score(response, truth)
        assert tuple(result) == SCORE_KEYS
        expected = float(any(c in "0123456789" for c in response[:LEAD_CHARS]))
        assert result["score"] == result["acc"] == expected
        assert result["exact"] in (0.0, 1.0)
        assert result["exact"] <= result["score"]
        if expected:
            assert result["pred"].isdigit()
            assert result["pred"] in response
            assert response.index(result["pred"]) < LEAD_CHARS
            number = re.match("[0-9]+", response[response.index(result["pred"]) :]).group()
            assert result["exact"] == float(len(number) <= PRED_MAX_CHARS and int(number) == int(truth))
        else:
            assert result["exact"] == 0.0

    @settings(max_examples=200, deadline=None)
    @given(st.binary(max_size=64))
    def test_any_bytes_score_like_their_decoded_text(self, raw: bytes) -> None:
        assert _score(raw) == _score(raw.decode("utf-8", errors="replace"))

    @settings(max_examples=100, deadline=None)
    @given(st.text(alphabet=st.characters(exclude_characters="0123456789"), max_size=LEAD_CHARS), st.text(max_size=20))
    def test_a_digit_after_the_lead_window_earns_nothing(self, lead: str, tail: str) -> None:
        response = lead.ljust(LEAD_CHARS, "x") + "7" + tail
        assert _score(response)["score"] == 0.0

    def test_verl_loads_it_by_path(self) -> None:
        """``custom_reward_function.path`` / ``name`` plumbing, as for the math reward."""
        from verl.trainer.ppo.reward import get_custom_reward_fn

        sys.modules.pop("custom_module", None)  # verl caches the module under this name
        config = OmegaConf.create({"custom_reward_function": {"path": str(TOY_TASK_FILE), "name": "compute_score"}})
        try:
            fn = get_custom_reward_fn(config)
            result = fn(data_source=toy_task.DATA_SOURCE, solution_str="12 is it", ground_truth="12", extra_info={})
        finally:
            sys.modules.pop("custom_module", None)
        assert result == _score("12 is it", "12")

    def test_naive_reward_manager_puts_the_score_on_the_last_token(self) -> None:
        import numpy as np
        import torch
        from transformers import PreTrainedTokenizerFast
        from verl import DataProto
        from verl.workers.reward_manager.naive import NaiveRewardManager

        from r1_ascend.launch.tiny_tokenizer import train_byte_level

        responses = ["5 apples", "no idea at all", "It is 12."]
        truths = ["5", "3", "11"]
        tokenizer = PreTrainedTokenizerFast(
            tokenizer_object=train_byte_level(responses, 300, ["[PAD]"]), pad_token="[PAD]"
        )
        ids = [tokenizer.encode(r) for r in responses]
        width = max(map(len, ids)) + 2
        response_ids = torch.full((len(ids), width), tokenizer.pad_token_id)
        mask = torch.zeros((len(ids), width), dtype=torch.long)
        for row, row_ids in enumerate(ids):
            response_ids[row, : len(row_ids)] = torch.tensor(row_ids)
            mask[row, : len(row_ids)] = 1
        prompts = torch.tensor([tokenizer.encode("What is 2 + 3?")] * len(ids))
        data = DataProto.from_dict(
            tensors={
                "prompts": prompts,
                "responses": response_ids,
                "input_ids": torch.cat([prompts, response_ids], dim=1),
                "attention_mask": torch.cat([torch.ones_like(prompts), mask], dim=1),
            },
            non_tensors={
                "data_source": np.array([toy_task.DATA_SOURCE] * len(ids), dtype=object),
                "reward_model": np.array([{"style": "rule", "ground_truth": t} for t in truths], dtype=object),
                "extra_info": np.array([{"index": i} for i in range(len(ids))], dtype=object),
            },
        )
        manager = NaiveRewardManager(tokenizer, num_examine=0, compute_score=compute_score)
        output = manager(data, return_dict=True)
        expected = [_score(r, t) for r, t in zip(responses, truths, strict=True)]
        for row, row_ids in enumerate(ids):
            assert output["reward_tensor"][row, len(row_ids) - 1].item() == expected[row]["score"]
            assert output["reward_tensor"][row].sum().item() == expected[row]["score"]
        assert set(output["reward_extra_info"]) == set(SCORE_KEYS)
        assert list(output["reward_extra_info"]["exact"]) == [e["exact"] for e in expected]


class TestData:
    """Deterministic parquet in the prepare-data layout, read by verl's RLHFDataset."""

    def test_files_have_the_prepare_data_schema_and_sums(self, data_dir: Path) -> None:
        for split, count in (("train", toy_task.TRAIN_ROWS), ("val", toy_task.VAL_ROWS)):
            table = pq.read_table(data_dir / f"{split}.parquet")
            assert table.schema.equals(SCHEMA)
            assert table.num_rows == count
            rows = table.to_pylist()
            assert [row["extra_info"]["index"] for row in rows] == list(range(count))
            for row, (a, b) in zip(rows, toy_task.problems(split), strict=True):
                assert row["data_source"] == toy_task.DATA_SOURCE
                assert row["extra_info"]["split"] == split
                assert row["prompt"][0] == {"role": "system", "content": toy_task.INSTRUCTION}
                assert row["prompt"][1]["content"] == f"What is {a} + {b}?"
                assert row["reward_model"] == {"style": "rule", "ground_truth": str(a + b)}

    def test_train_covers_every_one_digit_pair_once(self) -> None:
        assert sorted(toy_task.problems("train")) == [(a, b) for a in range(10) for b in range(10)]

    def test_val_is_disjoint_from_train(self) -> None:
        assert not set(toy_task.problems("val")) & set(toy_task.problems("train"))

    def test_unknown_split_is_an_error(self) -> None:
        with pytest.raises(ValueError, match="unknown split"):
            toy_task.problems("test")

    def test_same_bytes_every_time(self, data_dir: Path, tmp_path: Path) -> None:
        again = toy_task.write_data(tmp_path / "again")
        for name in ("train.parquet", "val.parquet"):
            assert (again / name).read_bytes() == (data_dir / name).read_bytes()

    def test_rlhf_dataset_reads_them(
        self, data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rehearsal_tokenizer
    ) -> None:
        """verl 0.6.1's RLHFDataset tokenises the rows with the rehearsal's tokenizer and chat template."""
        from verl.utils.dataset.rl_dataset import RLHFDataset

        monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf"))
        config = OmegaConf.create(
            {
                "cache_dir": str(tmp_path / "verl"),
                "max_prompt_length": 512,
                "filter_overlong_prompts": True,
                "filter_overlong_prompts_workers": 1,
                "return_full_prompt": True,
                "truncation": "error",
            }
        )
        files = [data_dir / "train.parquet", data_dir / "val.parquet"]
        dataset = RLHFDataset([str(f) for f in files], rehearsal_tokenizer, config)
        table = [*pq.read_table(files[0]).to_pylist(), *pq.read_table(files[1]).to_pylist()]
        assert len(dataset) == len(table)
        for position in (0, toy_task.TRAIN_ROWS, len(dataset) - 1):
            item, source = dataset[position], table[position]
            assert item["full_prompts"] == render_deepseek_v3(source["prompt"])
            assert item["full_prompts"].endswith(DEEPSEEK_ASSISTANT)
            n_tokens = int(item["attention_mask"].sum())
            assert rehearsal_tokenizer.decode(item["input_ids"][-n_tokens:]) == item["full_prompts"]
            assert item["reward_model"]["ground_truth"] == source["reward_model"]["ground_truth"]
            assert item["data_source"] == toy_task.DATA_SOURCE


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return toy_task.write_data(tmp_path_factory.mktemp("toy"))


@pytest.fixture(scope="module")
def rehearsal_tokenizer(tmp_path_factory: pytest.TempPathFactory):
    """The tokenizer of the rehearsal's model directory (byte-level, DeepSeek's chat template)."""
    from transformers import AutoTokenizer

    from r1_ascend.rehearse.inputs import write_model

    return AutoTokenizer.from_pretrained(str(write_model(tmp_path_factory.mktemp("model"))))
