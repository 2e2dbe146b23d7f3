"""The rehearsal's inputs: a model directory (DeepSeek-V3-shaped config + a working tokenizer) and verl parquet.

DeepSeek-V3's tokenizer cannot be downloaded here, so the model directory gets the quickstart's tiny byte-level
tokenizer (:mod:`r1_ascend.launch.tiny_tokenizer`: trained on the shipped sample, with DeepSeek's special tokens and
chat template): what verl's RLHFDataset, the reward and the rollout need is a working ``apply_chat_template`` and
token ids that decode back to text, not the real vocabulary. The config is the smoke model's tiny BF16 config
(:func:`r1_ascend.launch.smoke_model.smoke_model_config`) with ``vocab_size`` set to that tokenizer's size. The
parquet is written by ``r1-ascend prepare-data`` from the shipped sample, as a user would.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from r1_ascend.launch.smoke_model import sample_path, smoke_model_config


@dataclass(frozen=True)
class Inputs:
    model: Path
    data: Path

    def parquet(self, split: str) -> Path:
        """The file ``r1-ascend prepare-data`` writes for ``split`` (train, val)."""
        return self.data / f"{split}.parquet"


def write_model(out: Path) -> Path:
    """HF model directory: the smoke model's config (BF16, MTP off) sized to the tiny tokenizer, plus the tokenizer."""
    from transformers import AutoTokenizer

    from r1_ascend.launch.tiny_tokenizer import MAX_VOCAB, write_tiny_tokenizer

    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(smoke_model_config(vocab_size=MAX_VOCAB)) + "\n")
    vocab = write_tiny_tokenizer(out)
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id}
    config = smoke_model_config(vocab_size=vocab, pad_token_id=tokenizer.pad_token_id, **ids)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps(ids) + "\n")
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
