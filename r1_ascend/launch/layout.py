"""The parallel layout a resolved run config implies: actor/reference (Megatron) and rollout (vLLM) groups.

Pure arithmetic on plain values, so every rule can be tested without a cluster.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class LayoutError(ValueError):
    """The pipeline split cannot be computed (the message says which value is wrong and how to fix it)."""


@dataclass(frozen=True)
class TrainLayout:
    """Megatron layout of the actor (the reference model shares it: same process, same groups)."""

    world: int
    tp: int
    pp: int
    cp: int
    ep: int
    etp: int

    @property
    def model_parallel(self) -> int:
        return self.tp * self.pp * self.cp

    @property
    def dp(self) -> int:
        """Data-parallel size of the dense (non-expert) parameters, as verl and Megatron compute it."""
        return self.world // self.model_parallel

    @property
    def expert_dp(self) -> int:
        """Data-parallel size of the expert parameters: world / (PP x EP x expert-TP)."""
        return self.world // (self.pp * self.ep * self.etp)


@dataclass(frozen=True)
class RolloutLayout:
    world: int
    tp: int
    dp: int  # vLLM data parallel: one instance spans every rank (VLLM_DP_SIZE)

    @property
    def ep(self) -> int:
        """vLLM expert parallelism with DP: every rank holds a slice of the experts (EP = DP x TP)."""
        return self.dp * self.tp


def train_layout(config: Any, world: int) -> TrainLayout:
    mega = config.actor_rollout_ref.actor.megatron
    etp = mega.expert_tensor_parallel_size
    return TrainLayout(
        world=world,
        tp=int(mega.tensor_model_parallel_size),
        pp=int(mega.pipeline_model_parallel_size),
        cp=int(mega.context_parallel_size),
        ep=int(mega.expert_model_parallel_size),
        etp=int(etp) if etp is not None else int(mega.tensor_model_parallel_size),
    )


def stage_layers(num_layers: int, pp: int, first: int | None, last: int | None) -> list[int]:
    """Decoder layers per pipeline stage exactly as megatron-core 0.12.1's TransformerConfig splits them.

    ``first``/``last`` are ``num_layers_in_first/last_pipeline_stage`` (None = even split of what is left).
    """
    if pp < 1:
        msg = f"pipeline_model_parallel_size must be >= 1, got {pp}"
        raise LayoutError(msg)
    if first is None and last is None:
        if num_layers % pp:
            msg = (
                f"{num_layers} layers do not split evenly over pipeline_model_parallel_size={pp}; set "
                f"num_layers_in_first_pipeline_stage / num_layers_in_last_pipeline_stage (override_transformer_config)"
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
    per_middle = middle_layers // middle_stages
    stages = [per_middle] * middle_stages
    if first is not None:
        stages.insert(0, first)
    if last is not None:
        stages.append(last)
    return stages


def mindspeed_stage_layers(value: Any) -> list[int] | None:
    """MindSpeed's ``pipeline_num_transformer_layers`` ([[6], [8], ...]) as a flat per-stage list."""
    if value is None:
        return None
    stages = []
    for stage in value:
        items = list(stage) if isinstance(stage, list | tuple) or hasattr(stage, "__iter__") else [stage]
        stages.append(sum(int(x) for x in items))
    return stages
