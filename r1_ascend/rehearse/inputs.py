"""The rehearsal's inputs: a model directory (DeepSeek-V3-shaped config + a working tokenizer) and verl parquet.

DeepSeek-V3's tokenizer cannot be downloaded here, so the model directory gets a word-level tokenizer trained on the
shipped sample, with DeepSeek's special tokens, chat template and the R1 answer markers: what verl's RLHFDataset,
the reward and the rollout need is a working ``apply_chat_template`` and token ids, not the real vocabulary. The
config is the smoke model's structure with ``vocab_size`` set to that tokenizer's size. The parquet is written by
``r1-ascend prepare-data`` from the shipped sample, as a user would.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path


@dataclass(frozen=True)
class Inputs:
    model: Path
    data: Path

    @property
    def train(self) -> Path:
        return self.data / "train.parquet"

    @property
    def val(self) -> Path:
        return self.data / "val.parquet"


def sample_path() -> Path:
    return Path(str(files("r1_ascend.data").joinpath("sample", "deepscaler_sample.json")))


def write_tokenizer(out: Path) -> int:
    """Train and save the word-level tokenizer; return its vocabulary size."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from r1_ascend.data import template

    rows = json.loads(sample_path().read_text(encoding="utf-8"))
    texts = [template.R1_ZERO_INSTRUCTION, *template.PROTOCOL_MARKERS]
    texts += [f"{row['problem']} {row.get('answer', '')}" for row in rows]
    specials = ["[UNK]", "[PAD]", template.DEEPSEEK_BOS, template.DEEPSEEK_EOS, template.DEEPSEEK_USER]
    specials.append(template.DEEPSEEK_ASSISTANT)
    model = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    model.pre_tokenizer = pre_tokenizers.Whitespace()
    model.train_from_iterator(texts, trainers.WordLevelTrainer(special_tokens=specials))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=model,
        bos_token=template.DEEPSEEK_BOS,
        eos_token=template.DEEPSEEK_EOS,
        pad_token="[PAD]",
        unk_token="[UNK]",
    )
    tokenizer.chat_template = template.DEEPSEEK_V3_CHAT_TEMPLATE_SUBSET
    tokenizer.save_pretrained(str(out))
    return len(tokenizer)


def write_model(out: Path) -> Path:
    """HF model directory: the smoke model's config (BF16, MTP off) sized to the tokenizer, plus the tokenizer."""
    from transformers import AutoTokenizer

    from r1_ascend.launch.smoke_model import SMOKE_STRUCTURE
    from r1_ascend.weights.tiny import deepseek_v3_config

    out.mkdir(parents=True, exist_ok=True)
    vocab = write_tokenizer(out)
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    config = deepseek_v3_config(**SMOKE_STRUCTURE, num_nextn_predict_layers=0, vocab_size=vocab)
    config.pop("quantization_config", None)
    config.update(
        torch_dtype="bfloat16",
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    generation = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id}
    (out / "generation_config.json").write_text(json.dumps(generation) + "\n")
    return out


def prepare_data(out: Path) -> Path:
    """``r1-ascend prepare-data`` (train) and ``--val`` (validation) from the shipped sample."""
    cli = [sys.executable, "-m", "r1_ascend.cli", "prepare-data", "--output-dir", str(out), "--overwrite"]
    for extra in (["--input", str(sample_path())], ["--val"]):
        done = subprocess.run([*cli, *extra], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            msg = f"r1-ascend prepare-data {' '.join(extra)} failed ({done.returncode}): {done.stderr.strip()[-2000:]}"
            raise RuntimeError(msg)
    return out


def make_inputs(root: Path) -> Inputs:
    return Inputs(write_model(root / "model"), prepare_data(root / "data"))
