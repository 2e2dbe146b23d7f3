"""The prompt evaluation generates from is the one verl 0.6.1's RLHFDataset gives the rollout, token for token."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import datasets
import pyarrow.parquet as pq
import pytest
from omegaconf import OmegaConf

from r1_ascend.data.prepare import prepare_val
from r1_ascend.evaluate.problems import read_problems
from r1_ascend.evaluate.prompts import PromptError, decode_response, load_tokenizer, prompt_ids

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def adds_bos(tiny_hf: Path, tmp_path: Path) -> Path:
    """The tiny model with a tokenizer that, like DeepSeek-V3's (``add_bos_token: true``), adds BOS on encode."""
    model = tmp_path / "bos-model"
    shutil.copytree(tiny_hf, model)
    config_file = model / "tokenizer_config.json"
    config = json.loads(config_file.read_text(encoding="utf-8"))
    config |= {"tokenizer_class": "LlamaTokenizerFast", "add_bos_token": True, "legacy": True}
    config_file.write_text(json.dumps(config), encoding="utf-8")
    return model


@pytest.mark.parametrize("bos", [False, True], ids=["tiny-tokenizer", "adds-bos-like-deepseek-v3"])
def test_prompt_ids_equal_verls_raw_prompt_ids_on_the_shipped_sets(
    tiny_hf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bos: bool
) -> None:
    from verl.utils.dataset.rl_dataset import RLHFDataset

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf"))
    prepare_val(tmp_path / "data")
    parquet = tmp_path / "data" / "val.parquet"
    tokenizer = load_tokenizer(adds_bos(tiny_hf, tmp_path) if bos else tiny_hf)
    bos_id = tokenizer.bos_token_id
    assert (tokenizer.encode("x", add_special_tokens=True)[0] == bos_id) is bos
    config = {"cache_dir": str(tmp_path / "verl"), "max_prompt_length": 8192, "filter_overlong_prompts": False}
    dataset = RLHFDataset([str(parquet)], tokenizer, OmegaConf.create(config))
    problems = [p for s in read_problems([parquet]).values() for p in s]
    assert len(problems) == len(dataset) == pq.read_metadata(parquet).num_rows
    positions = [0, 29, 30, 112, 113, len(dataset) - 1]  # first and last row of each set
    for position in positions:
        item = dataset[position]
        ids = prompt_ids(tokenizer, problems[position])
        assert ids == list(item["raw_prompt_ids"]), position
        assert ids.count(bos_id) == 1  # the chat template's BOS only
        assert problems[position].set_name == item["data_source"]


def test_decoding_drops_special_tokens_as_verls_reward_manager_does(tiny_hf: Path) -> None:
    tokenizer = load_tokenizer(tiny_hf)
    ids = [*tokenizer.encode("<think>x</think> \\boxed{3}", add_special_tokens=False), tokenizer.eos_token_id]
    assert decode_response(tokenizer, ids) == tokenizer.decode(ids, skip_special_tokens=True)
    assert tokenizer.eos_token not in decode_response(tokenizer, ids)


def test_a_tokenizer_without_chat_template_is_refused_with_the_fix(tiny_hf: Path, tmp_path: Path) -> None:
    model = tmp_path / "model"
    shutil.copytree(tiny_hf, model)
    config_file = model / "tokenizer_config.json"
    config = json.loads(config_file.read_text(encoding="utf-8"))
    del config["chat_template"]
    config_file.write_text(json.dumps(config), encoding="utf-8")
    with pytest.raises(PromptError, match=r"no chat template.*--hf-dir"):
        load_tokenizer(model)
