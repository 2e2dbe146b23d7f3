"""The quickstart checkpoint's tokenizer loads offline the way verl loads it and formats prompts like DeepSeek-V3."""

from __future__ import annotations

import json

import pytest

from r1_ascend.data.template import DEEPSEEK_BOS, DEEPSEEK_EOS, build_prompt, render_deepseek_v3
from r1_ascend.launch.tiny_tokenizer import TOKENIZER_FILES, write_tiny_tokenizer


def _model_dir(path, vocab_size=512, **extra):
    path.mkdir(parents=True, exist_ok=True)
    config = {"vocab_size": vocab_size, "bos_token_id": 0, "eos_token_id": 1, "max_position_embeddings": 4096, **extra}
    (path / "config.json").write_text(json.dumps(config))
    return path


@pytest.mark.parametrize("vocab_size", [300, 512, 129280])
def test_tokenizer_loads_with_auto_tokenizer_and_stays_in_the_vocabulary(tmp_path, vocab_size):
    from transformers import AutoTokenizer

    model = _model_dir(tmp_path / "m", vocab_size)
    size = write_tiny_tokenizer(model)
    assert size <= vocab_size
    assert all((model / name).is_file() for name in TOKENIZER_FILES)
    tokenizer = AutoTokenizer.from_pretrained(str(model))  # what verl's hf_tokenizer calls
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id) == (0, 1, 1)
    prompt = build_prompt("Find $x$ if $2x + 3 = 7$.")
    ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True)
    assert max(ids) < vocab_size
    assert ids[0] == 0
    assert tokenizer.decode(ids) == render_deepseek_v3(prompt)


def test_byte_level_tokenizer_round_trips_any_text(tmp_path):
    from tokenizers import Tokenizer

    model = _model_dir(tmp_path / "m")
    write_tiny_tokenizer(model)
    tokenizer = Tokenizer.from_file(str(model / "tokenizer.json"))
    text = f"{DEEPSEEK_BOS}∫ x² dx = x³/3 — 答案 \\boxed{{42}}{DEEPSEEK_EOS}"
    assert tokenizer.decode(tokenizer.encode(text).ids, skip_special_tokens=False) == text


def test_vocabulary_too_small_for_bytes_is_refused(tmp_path):
    with pytest.raises(ValueError, match="too small for a byte-level tokenizer"):
        write_tiny_tokenizer(_model_dir(tmp_path / "m", 200))


def test_special_token_ids_other_than_the_configs_are_refused(tmp_path):
    with pytest.raises(ValueError, match="BOS/EOS ids 100000/100001"):
        write_tiny_tokenizer(_model_dir(tmp_path / "m", bos_token_id=100000, eos_token_id=100001))
