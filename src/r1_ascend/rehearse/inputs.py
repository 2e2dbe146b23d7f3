"""The rehearsal's inputs: the converted smoke checkpoint (HF BF16 + Megatron dist checkpoint) and the toy task.

The checkpoint goes through the quickstart's own chain (:mod:`r1_ascend.launch.quickstart`): a synthetic FP8
checkpoint with the smoke model's DeepSeek-V3 structure, ``convert-weights all`` (FP8 -> BF16 -> config fix ->
Megatron dist checkpoint), then the tiny byte-level tokenizer with DeepSeek's chat template (DeepSeek-V3's own
cannot be downloaded here; what verl's dataset, the reward and the rollout need is a working
``apply_chat_template`` and ids that decode back to text). The actor and the reference load the dist checkpoint
through verl's ``use_dist_checkpointing``, the rollout engine gets the actor's weights through verl's export: the
layouts the cluster run depends on are exercised end to end.

The data is the toy task (:mod:`r1_ascend.rehearse.toy_task`): a reward that a random model earns now and then,
so GRPO has a signal and the reward curve can rise.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from r1_ascend.launch.smoke_model import smoke_model_config


@dataclass(frozen=True)
class Inputs:
    model: Path  # HF BF16 directory with the tokenizer
    dist_ckpt: Path  # Megatron dist checkpoint converted from it
    data: Path

    def parquet(self, split: str) -> Path:
        """The toy task's parquet for ``split`` (train, val)."""
        return self.data / f"{split}.parquet"


def write_model(out: Path) -> Path:
    """A model directory without weights (engine and tokenizer tests): the smoke model's config (BF16, MTP off)
    sized to the tiny tokenizer, plus the tokenizer."""
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


def make_weights(root: Path) -> tuple[Path, Path]:
    """FP8 -> BF16 -> Megatron with the quickstart's functions (reused when already there); the tokenizer added."""
    from r1_ascend.launch.quickstart import add_tokenizer, convert, make_checkpoint

    weights = root / "weights"
    hf_dir, mcore = weights / "hf-bf16", weights / "mcore"
    if not (mcore / "metadata.json").is_file() or not (hf_dir / "config.json").is_file():
        make_checkpoint(root / "fp8", "tiny")
        convert(root / "fp8", weights)
    add_tokenizer(hf_dir)
    return hf_dir, mcore


def converted_weights(weights: Path) -> tuple[Path, Path]:
    """The quickstart's converted checkpoint in ``weights`` (``hf-bf16/`` and ``mcore/``), with its tokenizer."""
    from r1_ascend.launch.quickstart import add_tokenizer

    hf_dir, mcore = weights / "hf-bf16", weights / "mcore"
    for needed in (hf_dir / "config.json", mcore / "metadata.json"):
        if not needed.is_file():
            msg = (
                f"{needed} is missing: --weights takes the directory r1-ascend quickstart converts into "
                "(outputs/quickstart/weights, with hf-bf16/ and mcore/); run the quickstart first, or leave --weights "
                "out"
            )
            raise FileNotFoundError(msg)
    add_tokenizer(hf_dir)
    return hf_dir, mcore


def make_inputs(root: Path, weights: Path | None = None) -> Inputs:
    """Inputs under ``root``; the checkpoint is converted there unless ``weights`` holds the quickstart's."""
    from r1_ascend.rehearse.toy_task import write_data

    hf_dir, mcore = make_weights(root) if weights is None else converted_weights(weights)
    return Inputs(hf_dir, mcore, write_data(root / "data"))
