"""The CPU backend: transformers' ``generate`` with sampling, one prompt at a time, ``n`` sequences each.

vLLM's wheel has no CPU backend, so on a machine without NPUs (and in the tests, on the tiny DeepSeek-V3-shaped
checkpoint) the model runs in transformers, in float32. Sampling matches vLLM's: temperature and top-p only
(``top_k=0`` switches off transformers' default top-k of 50), greedy at temperature 0. Each prompt seeds torch's
generator with its request seed, so a problem's samples do not depend on which problems ran before it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from r1_ascend.evaluate.generation import (
    LENGTH,
    STOP,
    TRANSFORMERS,
    BackendSpec,
    Completion,
    Request,
    SampleProgress,
    SamplingOptions,
)
from r1_ascend.evaluate.prompts import decode_response


class TransformersBackend:
    name = TRANSFORMERS

    def __init__(self, spec: BackendSpec) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        self.tokenizer = spec.tokenizer
        self.model = AutoModelForCausalLM.from_pretrained(
            str(spec.model_dir), torch_dtype=torch.float32, trust_remote_code=spec.trust_remote_code
        )
        self.model.eval()
        self.eos_ids = _eos_ids(self.model.generation_config.eos_token_id, self.tokenizer.eos_token_id)
        pad = self.tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else self.eos_ids[0]

    def generate(
        self, requests: Sequence[Request], options: SamplingOptions, progress: SampleProgress
    ) -> list[list[Completion]]:
        import torch

        results = []
        sampling: dict[str, Any] = {"do_sample": options.temperature > 0}
        if options.temperature > 0:
            sampling |= {"temperature": options.temperature, "top_p": options.top_p, "top_k": 0}
        for request in requests:
            torch.manual_seed(request.seed)
            prompt = torch.tensor([list(request.token_ids)], dtype=torch.long)
            with torch.no_grad():
                out = self.model.generate(
                    prompt,
                    attention_mask=torch.ones_like(prompt),
                    max_new_tokens=options.max_new_tokens,
                    num_return_sequences=options.n,
                    eos_token_id=self.eos_ids,
                    pad_token_id=self.pad_id,
                    **sampling,
                )
            results.append([self._completion(row[prompt.shape[1] :].tolist()) for row in out])
            progress.update(options.n)
        return results

    def _completion(self, new_tokens: list[int]) -> Completion:
        """Cut at the first EOS (kept, as in vLLM's token ids; what follows is padding)."""
        for position, token in enumerate(new_tokens):
            if token in self.eos_ids:
                kept = new_tokens[: position + 1]
                return Completion(decode_response(self.tokenizer, kept), STOP, len(kept))
        return Completion(decode_response(self.tokenizer, new_tokens), LENGTH, len(new_tokens))


def _eos_ids(configured: int | list[int] | None, tokenizer_eos: int | None) -> list[int]:
    ids = configured if isinstance(configured, list) else [configured]
    found = [i for i in ids if i is not None] or ([tokenizer_eos] if tokenizer_eos is not None else [])
    if not found:
        msg = "the model has no EOS token id (generation_config.json or the tokenizer); generation could not stop"
        raise ValueError(msg)
    return found
