"""Expert load of a MoE actor: what patch ``verl_moe_expert_load`` logs each step, and how it is summarised.

The input is one training step's tokens per expert of every MoE layer, summed over the whole actor (megatron-core's
router counts them for its expert-bias update and all-reduces them over the data-parallel ranks). Per layer:

- ``max_over_mean``: the busiest expert's tokens over the mean (1.0 is perfect balance). Under expert parallelism the
  step waits for the busiest rank, so this is the factor a layer's expert compute is slowed by;
- ``experts_without_tokens``: experts that received no token in the step;
- ``top_ep_share``: the share of the layer's routed tokens held by the busiest expert-parallel rank (experts split
  evenly and in order over the ranks, as megatron-core and vLLM place them; balanced is 1 / EP).

Over all layers, the worst of each (``moe/max_over_mean``, ``moe/experts_without_tokens``, ``moe/top_ep_share``)
and the layer with the highest ``max_over_mean`` (``moe/worst_layer``). Layers are numbered as in the Hugging Face
checkpoint (``model.layers.N``), from 0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

PATCH = "verl_moe_expert_load"
PREFIX = "moe/"
#: Per-layer statistics, as ``moe/layer_NN/<name>``.
LAYER_STATISTICS = ("max_over_mean", "experts_without_tokens", "top_ep_share")
#: Step summaries: the worst layer's value of each statistic.
WORST = {name: f"{PREFIX}{name}" for name in LAYER_STATISTICS}
WORST_LAYER = f"{PREFIX}worst_layer"
#: Wall time the patch spent in the step (reading the counts, the pipeline all-reduce, the summaries), per rank.
TELEMETRY_MS = f"{PREFIX}telemetry_ms"


def layer_key(layer: int, statistic: str) -> str:
    """``moe/layer_03/max_over_mean``: two digits at least, so dashboards sort the layers in order."""
    return f"{PREFIX}layer_{layer:02d}/{statistic}"


def max_over_mean(tokens: Sequence[float]) -> float:
    """The busiest expert's load over the mean load; infinite when the layer received no token at all."""
    total = sum(tokens)
    return max(tokens) * len(tokens) / total if total > 0 else math.inf


def experts_without_tokens(tokens: Sequence[float]) -> int:
    return sum(1 for count in tokens if count <= 0)


def rank_shares(tokens: Sequence[float], ranks: int) -> list[float]:
    """The share of the layer's routed tokens each of ``ranks`` expert-parallel ranks holds (rank r has experts
    ``r * E / ranks`` to ``(r + 1) * E / ranks - 1``); all 0 when the layer received no token."""
    if ranks < 1 or len(tokens) % ranks:
        msg = f"{len(tokens)} experts cannot be split evenly over {ranks} expert-parallel ranks"
        raise ValueError(msg)
    per = len(tokens) // ranks
    total = sum(tokens)
    if total <= 0:
        return [0.0] * ranks
    return [sum(tokens[rank * per : (rank + 1) * per]) / total for rank in range(ranks)]


def layer_metrics(layer: int, tokens: Sequence[float], ep_size: int) -> dict[str, float]:
    return {
        layer_key(layer, "max_over_mean"): max_over_mean(tokens),
        layer_key(layer, "experts_without_tokens"): float(experts_without_tokens(tokens)),
        layer_key(layer, "top_ep_share"): max(rank_shares(tokens, ep_size)),
    }


def step_metrics(tokens_by_layer: Mapping[int, Sequence[float]], ep_size: int) -> dict[str, float]:
    """Every ``moe/`` metric of one step from each MoE layer's tokens per expert; empty without MoE layers."""
    if not tokens_by_layer:
        return {}
    metrics: dict[str, float] = {}
    for layer in sorted(tokens_by_layer):
        metrics.update(layer_metrics(layer, tokens_by_layer[layer], ep_size))
    for statistic, key in WORST.items():
        metrics[key] = max(metrics[layer_key(layer, statistic)] for layer in tokens_by_layer)
    metrics[WORST_LAYER] = float(
        max(sorted(tokens_by_layer), key=lambda layer: metrics[layer_key(layer, "max_over_mean")])
    )
    return metrics


def is_layer_metric(name: str) -> bool:
    return name.startswith(f"{PREFIX}layer_")


def split_layer_metric(name: str) -> tuple[int, str] | None:
    """``moe/layer_03/max_over_mean`` -> ``(3, "max_over_mean")``; None for any other name."""
    if not is_layer_metric(name):
        return None
    layer, _, statistic = name.removeprefix(f"{PREFIX}layer_").partition("/")
    if not layer.isdigit() or statistic not in LAYER_STATISTICS:
        return None
    return int(layer), statistic
