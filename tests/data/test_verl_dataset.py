"""The written parquet goes through verl 0.6.1's real RLHFDataset (tokenising, filtering, prompt_key)."""

from __future__ import annotations

from pathlib import Path

import datasets
import pyarrow.parquet as pq
import pytest
from omegaconf import OmegaConf

from r1_ascend.data import prepare as prep
from r1_ascend.data.template import DEEPSEEK_ASSISTANT, render_deepseek_v3

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def parquet_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("parquet")
    sample = Path(__file__).resolve().parents[2] / "data" / "sample" / "deepscaler_sample.json"
    prep.prepare([sample], out, test_size=16)
    prep.prepare_val(out)
    return out


@pytest.fixture
def make_dataset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_tokenizer):
    from verl.utils.dataset.rl_dataset import RLHFDataset

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf"))

    def make(files: list[Path], **overrides):
        config = {
            "cache_dir": str(tmp_path / "verl"),
            "max_prompt_length": 4096,
            "filter_overlong_prompts": True,
            "filter_overlong_prompts_workers": 1,
            "return_full_prompt": True,
            "truncation": "error",
        } | overrides
        return RLHFDataset([str(f) for f in files], tiny_tokenizer, OmegaConf.create(config))

    return make


def test_rlhf_dataset_yields_tokenised_rows_with_our_prompt(parquet_dir: Path, make_dataset, tiny_tokenizer) -> None:
    dataset = make_dataset([parquet_dir / "train.parquet"])
    table = pq.read_table(parquet_dir / "train.parquet").to_pylist()
    assert len(dataset) == len(table)
    for position in (0, len(dataset) - 1):
        item = dataset[position]
        source = table[position]
        assert item["full_prompts"] == render_deepseek_v3(source["prompt"])
        assert item["full_prompts"].endswith(DEEPSEEK_ASSISTANT)
        n_tokens = int(item["attention_mask"].sum())
        assert item["input_ids"][-n_tokens:].tolist() == tiny_tokenizer.encode(
            item["full_prompts"], add_special_tokens=False
        )
        assert item["index"] == source["extra_info"]["index"]
        assert item["reward_model"]["ground_truth"] == source["reward_model"]["ground_truth"]
        assert item["data_source"] == "deepscaler"


def test_overlong_prompts_are_filtered_by_token_count(parquet_dir: Path, make_dataset, tiny_tokenizer) -> None:
    table = pq.read_table(parquet_dir / "train.parquet").to_pylist()
    lengths = [len(tiny_tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True)) for r in table]
    limit = sorted(lengths)[len(lengths) // 2]
    dataset = make_dataset([parquet_dir / "train.parquet"], max_prompt_length=limit)
    kept = [r["extra_info"]["index"] for r, n in zip(table, lengths, strict=True) if n <= limit]
    assert 0 < len(kept) < len(table)
    assert [dataset[i]["index"] for i in range(len(dataset))] == kept


def test_train_and_val_files_concatenate_and_prompt_key(parquet_dir: Path, make_dataset) -> None:
    files = [parquet_dir / "test.parquet", parquet_dir / "val.parquet"]
    dataset = make_dataset(files, prompt_key="prompt")
    assert {dataset[i]["data_source"] for i in range(len(dataset))} == {"deepscaler", "aime24", "amc", "math500"}
    with pytest.raises(KeyError, match="question"):
        make_dataset([parquet_dir / "test.parquet"], prompt_key="question", filter_overlong_prompts=False)[0]
