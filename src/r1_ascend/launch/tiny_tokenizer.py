"""A small byte-level BPE tokenizer for the quickstart's synthetic checkpoint, built offline with ``tokenizers``.

DeepSeek-V3's tokenizer cannot be downloaded everywhere, and a checkpoint without tokenizer files cannot start a run
(verl loads the tokenizer with ``AutoTokenizer.from_pretrained`` before anything else). This one carries DeepSeek's
special tokens at the ids the synthetic ``config.json`` names (BOS 0, EOS 1) and the DeepSeek-V3 chat format, is
trained on the shipped sample problems, and never exceeds the model's vocabulary. Byte-level, so any text encodes
and any generated id decodes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from r1_ascend.launch.smoke_model import sample_path

if TYPE_CHECKING:
    from tokenizers import Tokenizer

#: Files that make a directory loadable by ``AutoTokenizer.from_pretrained``.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
#: Largest vocabulary trained (the sample is small; more merges would only memorise it).
MAX_VOCAB = 512


def _corpus() -> list[str]:
    from r1_ascend.data import template

    rows = json.loads(sample_path().read_text(encoding="utf-8"))
    return [template.R1_ZERO_INSTRUCTION, *(f"{row['problem']} {row.get('answer', '')}" for row in rows)]


def train_byte_level(texts: Iterable[str], vocab_size: int, special_tokens: Sequence[str]) -> Tokenizer:
    """A byte-level BPE tokenizer trained on ``texts``: any text encodes, and decoding gives it back exactly."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size < len(alphabet) + len(special_tokens):
        msg = f"vocab_size {vocab_size} is too small for a byte-level tokenizer ({len(alphabet)} bytes)"
        raise ValueError(msg)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(special_tokens), initial_alphabet=alphabet, show_progress=False
    )
    tokenizer.train_from_iterator(texts, trainer)
    return tokenizer


def write_tiny_tokenizer(model_dir: Path) -> int:
    """Write the tokenizer files into ``model_dir`` (next to its config.json); returns the vocabulary size."""
    from r1_ascend.data import template

    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    specials = [template.DEEPSEEK_BOS, template.DEEPSEEK_EOS, template.DEEPSEEK_USER, template.DEEPSEEK_ASSISTANT]
    if (config.get("bos_token_id"), config.get("eos_token_id")) != (0, 1):
        msg = f"{model_dir}/config.json has BOS/EOS ids {config.get('bos_token_id')}/{config.get('eos_token_id')}"
        raise ValueError(msg + ", the tokenizer puts them at 0/1")
    tokenizer = train_byte_level(_corpus(), min(int(config["vocab_size"]), MAX_VOCAB), specials)
    tokenizer.save(str(model_dir / "tokenizer.json"))
    names = {"bos_token": specials[0], "eos_token": specials[1], "pad_token": specials[1]}
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **names,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(config.get("max_position_embeddings", 4096)),
        "chat_template": template.DEEPSEEK_V3_CHAT_TEMPLATE_SUBSET,
    }
    (model_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n", encoding="utf-8")
    (model_dir / "special_tokens_map.json").write_text(json.dumps(names, indent=2) + "\n", encoding="utf-8")
    return tokenizer.get_vocab_size()
