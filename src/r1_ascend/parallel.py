"""Parallel sizes of a Megatron model and how its decoder layers split over pipeline stages.

One type and one split rule for everything that reasons about the training layout: preflight (does the run's
config fit the cluster and the model), the memory estimate, and the weight converter (how a dist checkpoint is
chunked into virtual rank files). Pure arithmetic on plain values; the model-specific rules (TP divides the heads,
EP divides the experts) stay with their users.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


class LayoutError(ValueError):
    """Parallel sizes or a pipeline split that cannot work (the message says which value and how to fix it)."""


@dataclass(frozen=True)
class Layout:
    """Megatron parallel sizes, plus how the layers split over the pipeline stages.

    ``etp`` None means expert TP = TP (Megatron's default). ``world`` None means the smallest world that holds
    the layout, one data-parallel replica of the experts: ``tp x pp x ep`` when cp = 1 (the weight converter's
    virtual ranks). The stage split is Megatron's: even, or ``first_stage_layers``/``last_stage_layers``
    (``num_layers_in_first/last_pipeline_stage``) with the middle stages even, or an explicit per-stage list
    ``pp_layers``.
    """

    tp: int = 1
    pp: int = 1
    ep: int = 1
    cp: int = 1
    etp: int | None = None
    world: int | None = None
    first_stage_layers: int | None = None
    last_stage_layers: int | None = None
    pp_layers: tuple[int, ...] = ()

    @property
    def expert_tp(self) -> int:
        return self.tp if self.etp is None else self.etp

    @property
    def model_parallel(self) -> int:
        """Ranks one replica of the dense (non-expert) parameters spans: TP x PP x CP."""
        return self.tp * self.pp * self.cp

    @property
    def expert_model_parallel(self) -> int:
        """Ranks one replica of the expert parameters spans: PP x EP x expert-TP."""
        return self.pp * self.ep * self.expert_tp

    @property
    def world_size(self) -> int:
        if self.world is not None:
            return self.world
        return math.lcm(self.model_parallel, self.expert_model_parallel)

    @property
    def dp(self) -> int:
        """Data-parallel size of the dense parameters, as verl and Megatron compute it."""
        return self.world_size // self.model_parallel

    @property
    def expert_dp(self) -> int:
        """Data-parallel size of the expert parameters: world / (PP x EP x expert-TP)."""
        return self.world_size // self.expert_model_parallel

    def rank(self, stage: int, ep_rank: int, tp_rank: int) -> int:
        """Rank order: pipeline stage outermost, then expert-parallel rank, then TP rank (innermost)."""
        return (stage * self.ep + ep_rank) * self.tp + tp_rank

    def stage_layers(self, num_layers: int) -> list[int]:
        """Decoder layers per pipeline stage (see ``stage_layers``)."""
        return stage_layers(
            num_layers, self.pp, first=self.first_stage_layers, last=self.last_stage_layers, explicit=self.pp_layers
        )


def stage_layers(
    num_layers: int,
    pp: int,
    *,
    first: int | None = None,
    last: int | None = None,
    explicit: Sequence[int] = (),
) -> list[int]:
    """Decoder layers per pipeline stage, as megatron-core 0.12.1's TransformerConfig splits them.

    ``first``/``last`` are ``num_layers_in_first/last_pipeline_stage`` (None = even split of what is left);
    ``explicit`` is a whole per-stage list (MindSpeed's ``pipeline_num_transformer_layers``, the converter's
    ``--pp-layers``), which must have ``pp`` entries of at least one layer summing to ``num_layers``. Every stage
    gets at least one layer. Raises ``LayoutError`` naming the values otherwise.
    """
    if pp < 1:
        msg = f"pipeline_model_parallel_size must be >= 1, got {pp}"
        raise LayoutError(msg)
    if explicit:
        return _explicit(num_layers, pp, list(explicit), first, last)
    if first is None and last is None:
        if num_layers % pp or num_layers < pp:
            msg = (
                f"{num_layers} layers do not split evenly over pipeline_model_parallel_size={pp}; set "
                f"num_layers_in_first_pipeline_stage / num_layers_in_last_pipeline_stage (override_transformer_config)"
                f" or give the layers per stage"
            )
            raise LayoutError(msg)
        return [num_layers // pp] * pp
    if pp == 1:
        msg = "num_layers_in_first/last_pipeline_stage are set but pipeline_model_parallel_size is 1; remove them"
        raise LayoutError(msg)
    for name, value in (("first", first), ("last", last)):
        if value is not None and value <= 0:
            msg = f"num_layers_in_{name}_pipeline_stage must be > 0, got {value}"
            raise LayoutError(msg)
    middle_stages = pp - (first is not None) - (last is not None)
    middle_layers = num_layers - (first or 0) - (last or 0)
    if middle_stages == 0:
        msg = (
            f"with pipeline_model_parallel_size={pp}, setting both num_layers_in_first_pipeline_stage ({first}) and "
            f"num_layers_in_last_pipeline_stage ({last}) leaves no middle stage and megatron-core 0.12 divides by "
            f"zero; set only num_layers_in_first_pipeline_stage (the last stage gets the rest)"
        )
        raise LayoutError(msg)
    if middle_layers < middle_stages or middle_layers % middle_stages:
        msg = (
            f"{num_layers} layers with first stage {first} and last stage {last} leave {middle_layers} layers for "
            f"{middle_stages} middle stages, which megatron-core requires to divide evenly (at least one each)"
        )
        raise LayoutError(msg)
    stages = [middle_layers // middle_stages] * middle_stages
    if first is not None:
        stages.insert(0, first)
    if last is not None:
        stages.append(last)
    return stages


def _explicit(num_layers: int, pp: int, stages: list[int], first: int | None, last: int | None) -> list[int]:
    problems = []
    if first is not None or last is not None:
        problems.append("the first/last stage sizes are set as well; give either those or the whole list")
    if len(stages) != pp:
        problems.append(f"it has {len(stages)} stages, pp={pp}")
    if sum(stages) != num_layers:
        problems.append(f"it sums to {sum(stages)}, the model has num_hidden_layers = {num_layers}")
    if any(n < 1 for n in stages):
        problems.append("every pipeline stage needs at least one layer")
    if problems:
        msg = f"layers per stage {stages}: " + "; ".join(problems)
        raise LayoutError(msg)
    return stages
