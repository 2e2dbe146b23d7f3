"""The prompt a problem's samples start from: its chat messages under the model's chat template, as token ids.

verl 0.6.1's ``RLHFDataset.__getitem__`` renders ``tokenizer.apply_chat_template(messages,
add_generation_prompt=True, tokenize=False)`` and the rollout generates from ``tokenizer.encode(text,
add_special_tokens=False)`` (its ``raw_prompt_ids``); this does the same, so evaluation sees the prompt the rollout
saw (without verl's ``max_prompt_length`` filter: every validation problem is evaluated).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from r1_ascend.evaluate.problems import Problem


class PromptError(ValueError):
    """The tokenizer cannot render the training prompts (the message says why and how to fix it)."""


def load_tokenizer(model_dir: Path, *, trust_remote_code: bool = False) -> Any:
    """The model's tokenizer, as verl loads it (``AutoTokenizer``), refusing one without a chat template."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), trust_remote_code=trust_remote_code)
    if not getattr(tokenizer, "chat_template", None):
        msg = (
            f"the tokenizer in {model_dir} has no chat template, so the training prompts cannot be rendered (verl's "
            "RLHFDataset refuses it too); copy tokenizer_config.json from the base model, e.g. by exporting with "
            "`r1-ascend convert-weights to-hf CKPT OUT --hf-dir BASE_MODEL_DIR`"
        )
        raise PromptError(msg)
    return tokenizer


def prompt_ids(tokenizer: Any, problem: Problem) -> list[int]:
    """Token ids of the problem's prompt, exactly as verl's RLHFDataset gives them to the rollout."""
    if problem.messages is None:
        msg = f"{problem.source}: no chat messages to render ({problem.malformed})"
        raise PromptError(msg)
    text = tokenizer.apply_chat_template(problem.messages, add_generation_prompt=True, tokenize=False)
    return list(tokenizer.encode(text, add_special_tokens=False))


def decode_response(tokenizer: Any, token_ids: list[int]) -> str:
    """Response text as verl's reward manager decodes it before scoring (special tokens, EOS included, dropped)."""
    return tokenizer.decode(token_ids, skip_special_tokens=True)
