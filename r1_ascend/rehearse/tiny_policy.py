"""The stand-in for the model's device compute in the rehearsal: a tiny torch policy that runs on the CPU.

One class plays both parts the NPU model plays in a real run, with the same parameter names on both sides (the
Hugging Face / vLLM names the actor->rollout weight export produces):

- the actor's and the reference's Megatron ``GPTModel`` chunk: verl's Megatron forward function calls it on packed
  (THD) input ids and gets logits ``[1, tokens, vocab]``; ``pre_process``/``post_process`` mark the single
  pipeline stage and ``zero_grad_buffer`` is what verl calls on a Megatron DDP chunk before each mini-batch;
- the rollout's vLLM ``DeepseekV2ForCausalLM``, in :class:`TinyPolicyLLM`: ``load_weights`` receives the synced
  actor weights and generation samples from them, so the rollout generates with the policy the actor just updated.

It is a residual MLP over token embeddings (each position sees only its own token): cheap enough that a whole
GRPO run fits in minutes on two CPU cores, yet a real differentiable policy whose log-probs, gradients, optimizer
state and checkpoints are real tensors. ``kv_b_proj`` gives every layer the MLA projection that vllm-ascend's
``AscendMLAImpl`` derives its absorbed matrices from after each weight load.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from r1_ascend.rehearse.cpu_engine import CPUStandInLLM, MLADims

HIDDEN = 32
NUM_LAYERS = 2
#: MLA dimensions of the stand-in attention (AscendMLAImpl.process_weights_after_loading splits kv_b_proj by them).
NUM_HEADS = 2
KV_LORA_RANK = 8
QK_NOPE_HEAD_DIM = 4
QK_ROPE_HEAD_DIM = 2
V_HEAD_DIM = 4
#: Same initial weights in the actor and the reference (both start from "the checkpoint").
INIT_SEED = 1234


class _Layer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.self_attn = torch.nn.Module()
        self.self_attn.kv_b_proj = torch.nn.Linear(
            KV_LORA_RANK, NUM_HEADS * (QK_NOPE_HEAD_DIM + V_HEAD_DIM), bias=False
        )
        self.mlp = torch.nn.Linear(HIDDEN, HIDDEN)


class TinyPolicy(torch.nn.Module):
    """``logits = lm_head(h_L)`` with ``h_0 = embed(token)`` and ``h_i = h_{i-1} + tanh(mlp_i(h_{i-1}))``."""

    pre_process = True
    post_process = True

    def __init__(self, vocab_size: int, seed: int = INIT_SEED) -> None:
        super().__init__()
        generator_state = torch.random.get_rng_state()
        torch.manual_seed(seed)
        self.model = torch.nn.Module()
        self.model.embed_tokens = torch.nn.Embedding(vocab_size, HIDDEN)
        self.model.layers = torch.nn.ModuleList(_Layer() for _ in range(NUM_LAYERS))
        self.lm_head = torch.nn.Linear(HIDDEN, vocab_size, bias=False)
        torch.random.set_rng_state(generator_state)
        self.vocab_size = vocab_size
        self.load_calls = 0

    def logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        hidden = self.model.embed_tokens(input_ids)
        for layer in self.model.layers:
            hidden = hidden + torch.tanh(layer.mlp(hidden))
        return self.lm_head(hidden).float()

    def forward(self, input_ids: torch.Tensor, attention_mask: Any = None, position_ids: Any = None, **_: Any):
        """Megatron ``GPTModel.forward`` as verl's packed-sequence forward calls it: logits for every input id."""
        return self.logits(input_ids)

    def zero_grad_buffer(self) -> None:
        """Megatron DDP's grad-buffer reset; here the plain ``.grad`` fields."""
        self.zero_grad(set_to_none=True)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """vLLM's ``load_weights``: copy each named tensor in, return the names loaded."""
        self.load_calls += 1
        params = dict(self.named_parameters())
        loaded = set()
        for name, tensor in weights:
            if name not in params:
                raise KeyError(f"the rollout model has no parameter {name!r} (has: {sorted(params)})")
            params[name].data.copy_(tensor.to(params[name].dtype))
            loaded.add(name)
        return loaded


class TinyPolicyLLM(CPUStandInLLM):
    """The rollout engine while the actor is a :class:`TinyPolicy`: ``CPUStandInLLM`` (engine shape, offloading
    lifecycle, sampling, outputs) with a float32 TinyPolicy as the model, so the synced actor weights load by name."""

    def _build_model(self, model_dir: Path, load_format: str, seed: int) -> tuple[torch.nn.Module, MLADims]:
        self.dtype = torch.float32
        dims = MLADims(NUM_HEADS, KV_LORA_RANK, QK_NOPE_HEAD_DIM, QK_ROPE_HEAD_DIM, V_HEAD_DIM)
        return TinyPolicy(int(self.hf_config.vocab_size)), dims

    def _prefill(self, prompts: list[list[int]]) -> tuple[torch.Tensor, Any]:
        """Each position sees only its own token: the next-token logits depend on the last prompt token alone."""
        return self.model.logits(torch.tensor([ids[-1] for ids in prompts])), None

    def _next_logits(self, state: Any, sampled: torch.Tensor) -> torch.Tensor:
        return self.model.logits(sampled)
