"""The parallel layouts a resolved run config implies: actor/reference (Megatron) and rollout (vLLM) groups.

The layout type and the pipeline split rule are ``r1_ascend.parallel``'s; this module only reads them from a
verl config, and reads MindSpeed's own per-stage list.
"""

from __future__ import annotations

from typing import Any

from r1_ascend.parallel import Layout


def train_layout(config: Any, world: int) -> Layout:
    """Megatron layout of the actor (the reference model shares it: same process, same groups) and its stage split."""
    mega = config.actor_rollout_ref.actor.megatron
    etp = mega.expert_tensor_parallel_size
    otc = mega.override_transformer_config
    first, last = otc.get("num_layers_in_first_pipeline_stage"), otc.get("num_layers_in_last_pipeline_stage")
    return Layout(
        world=world,
        tp=int(mega.tensor_model_parallel_size),
        pp=int(mega.pipeline_model_parallel_size),
        cp=int(mega.context_parallel_size),
        ep=int(mega.expert_model_parallel_size),
        etp=int(etp) if etp is not None else int(mega.tensor_model_parallel_size),
        first_stage_layers=int(first) if first is not None else None,
        last_stage_layers=int(last) if last is not None else None,
    )


def rollout_layout(tp: int, dp: int) -> Layout:
    """vLLM's layout: one instance of ``dp`` x TP ``tp`` ranks (VLLM_DP_SIZE = ``dp``) whose experts are split over
    every rank (EP = DP x TP), each expert held once."""
    return Layout(world=dp * tp, tp=tp, ep=dp * tp, etp=1)


def mindspeed_stage_layers(value: Any) -> list[int] | None:
    """MindSpeed's ``pipeline_num_transformer_layers`` ([[6], [8], ...]) as a flat per-stage list."""
    if value is None:
        return None
    stages = []
    for stage in value:
        items = list(stage) if isinstance(stage, list | tuple) or hasattr(stage, "__iter__") else [stage]
        stages.append(sum(int(x) for x in items))
    return stages
