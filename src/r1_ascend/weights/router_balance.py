"""Token-dependent, balanced expert routing for synthetic DeepSeek-V3 checkpoints, and how it is measured.

A router initialised like every other matrix (N(0, 0.02)) scores each expert within about 0.1 of 0.5 for every
token, and a random ``e_score_correction_bias`` then picks the experts whatever the token: a tiny model built that
way sends all of a layer's tokens to a handful of experts, or to one expert-parallel rank. Its MoE exercises neither
every expert nor the all-to-all in both directions, and a fault on an expert that never receives a token is
invisible. A trained DeepSeek-V3 looks different: the router's logits vary with the token, and the bias has been
moved by aux-loss-free balancing (DeepSeek-V3 technical report, section 2.1.2; Wang et al. 2024, arXiv:2408.15664)
until every expert carries its share.

A synthetic checkpoint is given the same two properties:

- the router weights are drawn with standard deviation ``1 / sqrt(hidden_size)`` (:func:`router_init_std`). The
  router reads the RMS-normalised hidden state, so its logits vary by about 1 from token to token and its sigmoid
  scores span roughly 0.27 to 0.73;
- the bias of each MoE layer, first to last, is set by the sign update that training applies, run on the router
  scores of calibration prompts (:func:`balance_expert_bias`) until every expert's load is close to the mean. The
  experts are chosen by transformers' own ``DeepseekV3TopkRouter.get_topk_indices`` (sigmoid scores plus bias,
  group-limited top-k), the routing the rollout engine and megatron-core's router both implement. The bias is
  shifted so that its smallest entry is 0: a shift changes no selection, and keeps every biased score positive,
  which transformers' group masking (masked scores become 0, not -inf) needs to agree with megatron-core's.

The counting helpers (:func:`routed_tokens`, :class:`LayerLoad`) measure the same thing on any model, and are what
the tests and the quickstart use to show the result.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

import torch

from r1_ascend.patches.rules import expert_load

log = logging.getLogger(__name__)

PromptSet = Sequence[Sequence[int]]

#: Sign-update schedule of the calibration: the step size falls geometrically from FIRST to LAST over ITERATIONS.
ITERATIONS = 400
FIRST_STEP = 0.05
LAST_STEP = 0.002


def router_init_std(hidden_size: int) -> float:
    """Standard deviation of a synthetic router's weights: router logits that vary by about 1 between tokens."""
    return 1.0 / math.sqrt(hidden_size)


@dataclass(frozen=True)
class LayerLoad:
    """Tokens routed to each expert of one MoE layer (a token counts once for each of its top-k experts); the
    statistics are those the run's telemetry logs (:mod:`r1_ascend.patches.rules.expert_load`)."""

    layer: int
    tokens: tuple[float, ...]

    @property
    def experts(self) -> int:
        return len(self.tokens)

    @property
    def experts_used(self) -> int:
        return self.experts - expert_load.experts_without_tokens(self.tokens)

    @property
    def max_over_mean(self) -> float:
        """The busiest expert's load over the mean load (1.0 is perfect balance)."""
        return expert_load.max_over_mean(self.tokens)

    def rank_shares(self, ranks: int) -> list[float]:
        """The share of the routed tokens each of ``ranks`` expert-parallel ranks receives."""
        return expert_load.rank_shares(self.tokens, ranks)


def moe_routers(model: torch.nn.Module) -> dict[int, Any]:
    """transformers' DeepSeek-V3 routers by decoder-layer index."""
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

    routers = {}
    for index, layer in enumerate(model.model.layers):
        gate = getattr(layer.mlp, "gate", None)
        if isinstance(gate, DeepseekV3TopkRouter):
            routers[index] = gate
    return routers


@torch.no_grad()
def routed_tokens(model: torch.nn.Module, prompts: PromptSet) -> dict[int, LayerLoad]:
    """Each MoE layer's load when ``model`` (transformers' DeepSeek-V3) reads every token of ``prompts``."""
    routers = moe_routers(model)
    counts = {index: torch.zeros(router.n_routed_experts, dtype=torch.float64) for index, router in routers.items()}

    def count(into: torch.Tensor, output: tuple[torch.Tensor, torch.Tensor]) -> None:
        chosen = output[0].flatten()
        into.index_add_(0, chosen, torch.ones(chosen.numel(), dtype=torch.float64))

    hooks = [
        router.register_forward_hook(lambda _m, _i, out, into=counts[index]: count(into, out))
        for index, router in routers.items()
    ]
    try:
        for ids in prompts:
            model(input_ids=torch.tensor([list(ids)]))
    finally:
        for hook in hooks:
            hook.remove()
    return {index: LayerLoad(index, tuple(c.tolist())) for index, c in counts.items()}


class _Captured(Exception):
    """Raised by the capture hook: the forward has reached the router being calibrated; nothing after it is needed."""


@contextmanager
def _capture_router_input(router: torch.nn.Module, into: list[torch.Tensor]) -> Iterator[None]:
    def hook(_module: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
        hidden = inputs[0]
        into.append(hidden.reshape(-1, hidden.shape[-1]).float())
        raise _Captured

    handle = router.register_forward_pre_hook(hook)
    try:
        yield
    finally:
        handle.remove()


@torch.no_grad()
def router_scores(model: torch.nn.Module, layer: int, prompts: PromptSet) -> torch.Tensor:
    """The sigmoid scores [tokens, experts] router ``layer`` gives every token of ``prompts`` (the forward stops at
    that router), computed as ``DeepseekV3TopkRouter.forward`` computes them."""
    router = moe_routers(model)[layer]
    hidden: list[torch.Tensor] = []
    with _capture_router_input(router, hidden):
        for ids in prompts:
            with suppress(_Captured):
                model(input_ids=torch.tensor([list(ids)]))
    inputs = torch.cat(hidden)
    return torch.nn.functional.linear(inputs, router.weight.float()).sigmoid()


@torch.no_grad()
def balance_expert_bias(
    model: torch.nn.Module, prompt_sets: Sequence[PromptSet], iterations: int = ITERATIONS
) -> dict[int, torch.Tensor]:
    """Set every MoE layer's ``e_score_correction_bias`` of ``model`` (in place) so its experts carry equal loads on
    ``prompt_sets``, each set weighing as much as the others however many tokens it has; returns the biases.

    Layers are calibrated first to last, each on the scores its router gives once the layers before it are
    balanced. Per iteration, the bias of an expert below the mean load rises by the current step and one above it
    falls (training's update, with a falling step size so it settles).
    """
    if not any(len(prompts) for prompts in prompt_sets):
        msg = "balancing the expert bias needs at least one calibration prompt"
        raise ValueError(msg)
    biases = {}
    for layer, router in moe_routers(model).items():
        parts = [router_scores(model, layer, prompts) for prompts in prompt_sets if len(prompts)]
        weights = torch.cat([torch.full((len(part),), 1.0 / len(part)) for part in parts])
        # tokens with the same scores (every prompt's shared template prefix) are one row with their summed weight:
        # the same loads for a fraction of the rows
        scores, rows = torch.unique(torch.cat(parts), dim=0, return_inverse=True)
        weights = torch.zeros(len(scores)).index_add_(0, rows, weights)
        experts, top_k = int(router.n_routed_experts), int(router.top_k)
        target = weights.sum() * top_k / experts
        per_choice = weights.repeat_interleave(top_k)
        bias = torch.zeros(experts)
        with _one_thread():  # hundreds of small ops: thread hand-offs would cost more than the arithmetic
            for step in range(iterations):
                router.e_score_correction_bias.copy_(bias)
                chosen = router.get_topk_indices(scores)
                load = torch.zeros(experts).index_add_(0, chosen.flatten(), per_choice)
                size = FIRST_STEP * (LAST_STEP / FIRST_STEP) ** (step / max(iterations - 1, 1))
                bias += size * torch.sign(target - load)
        bias -= bias.min()
        router.e_score_correction_bias.copy_(bias)
        biases[layer] = bias.clone()
    return biases


@contextmanager
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def reference_model(config: Mapping[str, Any], state: Mapping[str, torch.Tensor]) -> torch.nn.Module:
    """transformers' ``DeepseekV3ForCausalLM`` in float32 with ``state`` (HF names, MTP layers left out)."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    hf_config = DeepseekV3Config.from_dict({k: v for k, v in config.items() if k != "quantization_config"})
    with torch.random.fork_rng(devices=[]):
        model = DeepseekV3ForCausalLM._from_config(hf_config, torch_dtype=torch.float32)
    model.load_state_dict({name: tensor.float() for name, tensor in state.items()}, strict=True)
    return model.eval()


def bias_name(layer: int) -> str:
    """The checkpoint name of layer ``layer``'s expert bias."""
    return f"model.layers.{layer}.mlp.gate.e_score_correction_bias"


def balanced_biases(
    config: Mapping[str, Any], state: Mapping[str, torch.Tensor], prompt_sets: Sequence[PromptSet]
) -> dict[str, torch.Tensor]:
    """The float32 expert biases (by checkpoint name) that balance the model ``config`` + ``state`` on
    ``prompt_sets``; logs each layer's resulting load."""
    model = reference_model(config, state)
    biases = balance_expert_bias(model, prompt_sets)
    calibration = [prompt for prompts in prompt_sets for prompt in prompts]
    after = routed_tokens(model, calibration)
    for layer in biases:
        log.info(
            "router of layer %d balanced on %d prompts: %d of %d experts used, busiest/mean %.2f",
            layer,
            len(calibration),
            after[layer].experts_used,
            after[layer].experts,
            after[layer].max_over_mean,
        )
    return {bias_name(layer): bias.to(torch.float32) for layer, bias in biases.items()}
