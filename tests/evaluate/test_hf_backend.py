"""The CPU backend at its boundary: the arguments transformers' ``generate`` gets (vLLM's sampling: temperature and
top-p, top-k off), the seed per prompt, and where a completion ends (first EOS; none: truncated)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from r1_ascend.evaluate import generation as gen
from r1_ascend.evaluate.hf_backend import TransformersBackend
from r1_ascend.evaluate.prompts import load_tokenizer


@pytest.fixture(scope="module")
def backend(tiny_hf: Path) -> TransformersBackend:
    tokenizer = load_tokenizer(tiny_hf)
    return TransformersBackend(gen.BackendSpec(tiny_hf, tokenizer, 0, 4096))


def test_generate_gets_vllms_sampling_and_each_prompts_seed(backend, monkeypatch: pytest.MonkeyPatch) -> None:
    tok = backend.tokenizer
    eos, pad = backend.eos_ids[0], backend.pad_id
    words = tok.encode(" the answer", add_special_tokens=False)[:2]
    calls = []

    def recording_generate(prompt, **kwargs):
        calls.append((prompt.tolist(), kwargs, torch.initial_seed()))
        stopped = [*words, eos, pad, pad]  # ends at EOS; the rest is padding
        running = [*words, *words, words[0]]  # reaches max_new_tokens
        return torch.tensor([[*prompt[0].tolist(), *stopped], [*prompt[0].tolist(), *running]])

    monkeypatch.setattr(backend.model, "generate", recording_generate)
    requests = [gen.Request((5, 6, 7), seed=11), gen.Request((8,), seed=13)]
    progress = gen.SampleProgress("amc", 4)
    results = backend.generate(requests, gen.SamplingOptions(2, 0.6, 0.95, 5), progress)

    assert [c[0] for c in calls] == [[[5, 6, 7]], [[8]]]
    assert [c[2] for c in calls] == [11, 13]
    for _, kwargs, _ in calls:
        assert kwargs["do_sample"] is True
        assert (kwargs["temperature"], kwargs["top_p"], kwargs["top_k"]) == (0.6, 0.95, 0)
        assert (kwargs["max_new_tokens"], kwargs["num_return_sequences"]) == (5, 2)
        assert kwargs["eos_token_id"] == backend.eos_ids
    stopped, running = results[0]
    assert (stopped.finish_reason, stopped.tokens, stopped.text) == (gen.STOP, 3, tok.decode(words))
    assert (running.finish_reason, running.tokens) == (gen.LENGTH, 5)
    assert progress.done == 4


def test_temperature_zero_is_greedy(backend, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def recording_generate(prompt, **kwargs):
        calls.append(kwargs)
        return torch.cat([prompt, torch.tensor([[backend.eos_ids[0]]])], dim=1)

    monkeypatch.setattr(backend.model, "generate", recording_generate)
    (result,) = backend.generate(
        [gen.Request((5,), 0)], gen.SamplingOptions(1, 0.0, 0.95, 8), gen.SampleProgress("x", 1)
    )
    assert calls[0]["do_sample"] is False
    assert not {"temperature", "top_p", "top_k"} & set(calls[0])
    assert result[0] == gen.Completion("", gen.STOP, 1)


def test_the_real_model_returns_n_completions_within_the_limit(backend) -> None:
    prompt = tuple(backend.tokenizer.encode("What is 1 + 1?", add_special_tokens=False))
    options = gen.SamplingOptions(2, 0.6, 0.95, 4)
    (completions,) = backend.generate([gen.Request(prompt, 3)], options, gen.SampleProgress("x", 2))
    again = backend.generate([gen.Request(prompt, 3)], options, gen.SampleProgress("x", 2))[0]
    assert len(completions) == 2
    assert all(c.tokens <= 4 and c.finish_reason in (gen.STOP, gen.LENGTH) for c in completions)
    assert completions == again  # same seed, same samples
