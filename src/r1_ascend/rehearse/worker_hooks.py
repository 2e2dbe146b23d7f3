"""What the rehearsal installs in every Ray worker after the overlay's prelude: the CPU platform, then its records.

The rehearsal names this module in ``VERL_USE_EXTERNAL_MODULES`` after ``r1_ascend.patches.prelude``, so verl imports
it in each worker right after the overlay is applied. It installs the CPU platform (:mod:`r1_ascend.cpu`: the
device-only calls of megatron-core and verl's workers, and the ``vllm.LLM`` stand-in; the list, with why, is
:data:`r1_ascend.cpu.workers.STAND_INS`). The actor and the reference are megatron-core's DeepSeek-V3 ``GPTModel`` as
verl builds them, with Megatron DDP, the ``DistributedOptimizer``, Megatron's no-pipelining schedule, verl's
``MegatronCheckpointManager`` (dist checkpointing) and verl's ``per_tensor_generator`` export, all upstream code.

Then it records, per worker process, the rollout lifecycle calls the worker makes (``lifecycle-<pid>.log`` under
``R1_ASCEND_REHEARSE_DIR``) so the rehearsal can assert their order, each actor update's expert load and expert
bias (patch ``verl_moe_expert_load``'s listener), the rollout engine's expert bias after every weight sync and, after
every generation, how often vLLM's ``Sampler.forward`` ran and which patch had replaced it, so the rehearsal can
check that every expert is used, that the engine follows the actor's bias and that the overlay's sampler sampled
(:mod:`r1_ascend.rehearse.expert_checks`), and each weight sync's verdict and cost from the weight-sync check
(patch ``verl_weight_sync_check``'s listener). With ``R1_ASCEND_REHEARSE_ACTOR_FAULT`` set it plants that fault into
the actor's and the reference's model once their weights are loaded; with ``R1_ASCEND_REHEARSE_ROLLOUT_FAULT`` the
rollout engine plants that one (:mod:`r1_ascend.rehearse.rollout_faults`); with
``R1_ASCEND_REHEARSE_SHUFFLE_REWARDS=1`` the trainer permutes each training batch's rewards (the control); with
``R1_ASCEND_REHEARSE_HOLD=STAGE@STEP`` each worker waits on entering that stage until the process fault is planted.
"""

from __future__ import annotations

import functools
import gc
import json
import os
import time
from typing import Any

import torch

from r1_ascend import envs
from r1_ascend.rehearse.fault_hold import hold_for_the_fault

# --- lifecycle record ---------------------------------------------------------------------------------------------


def _record(event: str, **fields: Any) -> None:
    directory = envs.rehearse_dir()
    if not directory:
        return
    line = json.dumps({"t": time.time(), "pid": os.getpid(), "event": event, **fields})
    with open(os.path.join(directory, f"lifecycle-{os.getpid()}.log"), "a", encoding="utf-8") as f:
        f.write(line + "\n")


def _recorded(name: str, method: Any) -> Any:
    @functools.wraps(method)
    async def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        tags = kwargs.get("tags", args[0] if args and name == "resume" else None)
        _record(f"{name}({','.join(tags)})" if tags else name)
        result = await method(self, *args, **kwargs)
        if name == "update_weights":
            _record_engine_bias(self)
            _record_loading(self)
        return result

    return wrapper


def _record_loading(rollout: Any) -> None:
    """Which model's ``load_weights`` the sync just done went through, and how many syncs so far did."""
    loader = rollout.inference_engine.model.vllm_loader
    model = None if loader.model is None else f"{type(loader.model).__module__}.{type(loader.model).__qualname__}"
    _record("loaded", model=model, loads=loader.loads)


def _record_engine_bias(rollout: Any) -> None:
    """The expert bias of every MoE layer of the rollout engine's model, as the sync just left it."""
    from r1_ascend.patches.impl.rollout_vllm import EngineParts
    from r1_ascend.weights.router_balance import moe_routers

    model = EngineParts.locate(rollout.inference_engine).model
    bias = {
        str(layer): router.e_score_correction_bias.detach().float().tolist()
        for layer, router in moe_routers(model).items()
    }
    loader = model.vllm_loader.model
    held_in = None if loader is None else str(_bias_dtype(loader))
    _record("engine_bias", bias=bias, held_in=held_in)


def _bias_dtype(vllm_model: Any) -> Any:
    """The dtype vLLM's model holds the routers' expert bias in (the first MoE layer's)."""
    return next(p.dtype for name, p in vllm_model.named_parameters() if name.endswith("e_score_correction_bias"))


def _record_sampling(rollout: Any) -> None:
    """How the generation just done sampled: the calls of vLLM's ``Sampler.forward`` and the patch that replaced it
    (the engine's :class:`r1_ascend.cpu.engine.SamplerCalls`)."""
    _record("sampled", **rollout.inference_engine.sampler_calls.take())


def _record_lifecycle() -> None:
    from r1_ascend.patches.vllm_rollout_offload import rollout_class

    NPUOffloadVLLMRollout = rollout_class()
    for name in ("release", "resume", "update_weights"):
        method = NPUOffloadVLLMRollout.__dict__[name]
        if not getattr(method, "__r1_rehearse__", False):
            wrapped = _recorded(name, method)
            wrapped.__r1_rehearse__ = True
            setattr(NPUOffloadVLLMRollout, name, wrapped)

    original = NPUOffloadVLLMRollout.__dict__["generate_sequences"]
    if not getattr(original, "__r1_rehearse__", False):

        @functools.wraps(original)
        def generate(self: Any, prompts: Any, **kwargs: Any) -> Any:
            _record("generate", validate=bool(prompts.meta_info.get("validate", False)))
            result = original(self, prompts, **kwargs)
            _record_sampling(self)
            return result

        generate.__r1_rehearse__ = True
        NPUOffloadVLLMRollout.generate_sequences = generate


def _record_checkpoint_loads() -> None:
    """Which ``global_step_N`` each worker resumed from (verl's real checkpoint manager, recorded around it)."""
    from verl.utils.checkpoint.megatron_checkpoint_manager import MegatronCheckpointManager

    original = MegatronCheckpointManager.__dict__["load_checkpoint"]
    if getattr(original, "__r1_rehearse__", False):
        return

    @functools.wraps(original)
    def load_checkpoint(self: Any, local_path: str, *args: Any, **kwargs: Any) -> Any:
        result = original(self, local_path, *args, **kwargs)
        step = os.path.basename(os.path.dirname(str(local_path).rstrip("/"))).removeprefix("global_step_")
        _record("load_checkpoint", step=int(step) if step.isdigit() else step)
        return result

    load_checkpoint.__r1_rehearse__ = True
    MegatronCheckpointManager.load_checkpoint = load_checkpoint


def _record_model(chunks: list[Any]) -> None:
    """The model class, its parameters on this rank and the parallel layout, each time verl builds a model (an
    entry of :data:`r1_ascend.cpu.mcore.MODEL_LISTENERS`)."""
    import verl.utils.megatron_utils as megatron_utils
    from megatron.core import parallel_state as mpu

    inner = megatron_utils.unwrap_model(chunks[0])
    _record(
        "model",
        cls=f"{type(inner).__module__}.{type(inner).__qualname__}",
        parameters=sum(p.numel() for chunk in chunks for p in chunk.parameters()),
        tp=mpu.get_tensor_model_parallel_world_size(),
        ep=mpu.get_expert_model_parallel_world_size(),
        pp=mpu.get_pipeline_model_parallel_world_size(),
        dp=mpu.get_data_parallel_world_size(),
        ep_rank=mpu.get_expert_model_parallel_rank(),
    )


def _record_stages() -> None:
    """Each worker-method stage the trainer calls (patch verl_worker_watchdog's listeners), so faults can be planted
    in a named stage."""
    from r1_ascend.patches import verl_worker_watchdog

    if _record_stage not in verl_worker_watchdog.STAGE_LISTENERS:
        verl_worker_watchdog.STAGE_LISTENERS.append(_record_stage)


#: The training step of the update under way in this worker (its stage record), for the expert-load record.
_update_step: list[int | None] = [None]


def _record_stage(stage: str, phase: str, step: int | None) -> None:
    _record("stage", stage=stage, phase=phase, step=step)
    if phase == "enter":
        hold_for_the_fault(stage, step)
    if stage == "update_actor" and phase == "enter":
        _update_step[0] = step
    if stage == "init_model" and phase == "leave":
        _freeze_heap()


def _freeze_heap() -> None:
    """Keep what the worker built at start out of every later garbage collection: verl's sharding manager runs
    ``gc.collect()`` three times per rollout (``aggressive_empty_cache``), each a walk over torch's, transformers'
    and megatron-core's objects, and on the host that walk took a quarter of a worker's time per step (py-spy).
    Objects made later are collected as before."""
    gc.collect()
    gc.freeze()


def _record_expert_load() -> None:
    """Each actor update's expert load and bias (patch verl_moe_expert_load's listener)."""
    from r1_ascend.patches import verl_moe_expert_load

    if _record_load not in verl_moe_expert_load.LOAD_LISTENERS:
        verl_moe_expert_load.LOAD_LISTENERS.append(_record_load)


def _record_weight_checks() -> None:
    """Each weight sync's verdict and cost (patch verl_weight_sync_check's listener)."""
    from r1_ascend.patches.impl import weight_check

    if _record_weight_check not in weight_check.CHECK_LISTENERS:
        weight_check.CHECK_LISTENERS.append(_record_weight_check)


def _record_weight_check(report: Any) -> None:
    _record(
        "weight_checked",
        sync=report.sync,
        rank=report.rank,
        slots=report.slots,
        shares=report.shares,
        mismatches=len(report.mismatches),
        first=report.mismatches[0].message() if report.mismatches else None,
        predict_s=report.predict_s,
        receive_s=report.receive_s,
        verify_s=report.verify_s,
        sync_s=report.sync_s,
    )


def _record_load(load: Any) -> None:
    import torch.distributed as dist

    _record(
        "expert_load",
        step=_update_step[0],
        rank=dist.get_rank() if dist.is_initialized() else 0,
        ep=load.ep_size,
        optimizer_steps=load.optimizer_steps,
        tokens={str(layer): tokens for layer, tokens in load.tokens.items()},
        bias={str(layer): bias for layer, bias in load.bias.items()},
    )


def _plant_actor_fault() -> None:
    """``R1_ASCEND_REHEARSE_ACTOR_FAULT=dead-expert@LAYER:EXPERT``: after verl loads the actor's (and the
    reference's) weights, that expert's router bias is -inf, so megatron-core never routes a token to it; the export
    carries the bias to the rollout engine, which then skips the expert too."""
    spec = envs.rehearse_actor_fault()
    if spec is None:
        return
    import verl.workers.megatron_workers as megatron_workers

    layer, expert = parse_dead_expert(spec)
    load = megatron_workers.load_mcore_dist_weights
    if getattr(load, "__r1_rehearse__", False):
        return

    @functools.wraps(load)
    def load_mcore_dist_weights(parallel_model: Any, *args: Any, **kwargs: Any) -> Any:
        result = load(parallel_model, *args, **kwargs)
        from r1_ascend.patches.verl_moe_expert_load import stage_routers

        for router in stage_routers(parallel_model):
            if int(router.layer_number) - 1 == layer:
                with torch.no_grad():
                    router.expert_bias[expert] = float("-inf")
                _record("actor_fault", fault="dead-expert", layer=layer, expert=expert)
        return result

    load_mcore_dist_weights.__r1_rehearse__ = True
    megatron_workers.load_mcore_dist_weights = load_mcore_dist_weights


def _shuffle_rewards() -> None:
    """``R1_ASCEND_REHEARSE_SHUFFLE_REWARDS=1`` (the control ``rehearse --shuffle-rewards``): the trainer's training
    rewards permuted within each batch (r1_ascend.rehearse.reward_shuffle)."""
    if not envs.rehearse_shuffle_rewards():
        return
    import verl.trainer.ppo.ray_trainer as ray_trainer

    from r1_ascend.rehearse.reward_shuffle import shuffling

    if getattr(ray_trainer.compute_reward, "__r1_rehearse__", False):
        return
    shuffled = shuffling(ray_trainer.compute_reward, envs.rehearse_seed())
    shuffled.__r1_rehearse__ = True
    ray_trainer.compute_reward = shuffled
    _record("shuffle_rewards")


def parse_dead_expert(spec: str) -> tuple[int, int]:
    """``dead-expert@LAYER:EXPERT`` -> (layer, expert), layers numbered as in the checkpoint."""
    name, _, where = spec.partition("@")
    layer, _, expert = where.partition(":")
    if name != "dead-expert" or not layer.isdigit() or not expert.isdigit():
        msg = f"{envs.R1_ASCEND_REHEARSE_ACTOR_FAULT}={spec!r}: expected dead-expert@LAYER:EXPERT, e.g. dead-expert@2:5"
        raise ValueError(msg)
    return int(layer), int(expert)


# --- install ------------------------------------------------------------------------------------------------------


def _record_vllm_groups(_engine: Any) -> None:
    """An entry of ``r1_ascend.cpu.engine.ENGINE_HOOKS``: vLLM's TP, DP and EP groups this rank's engine was built
    over (global ranks), for :func:`r1_ascend.rehearse.lifecycle.check_vllm_groups`."""
    from vllm.distributed import parallel_state

    _record(
        "vllm_groups",
        rank=torch.distributed.get_rank(),
        tp=list(parallel_state.get_tp_group().ranks),
        dp=list(parallel_state.get_dp_group().ranks),
        ep=list(parallel_state.get_ep_group().ranks),
    )


def install() -> None:
    """Install the CPU platform, then every record and planted fault of this module, in this process (idempotent)."""
    from r1_ascend.cpu import engine, mcore, workers
    from r1_ascend.rehearse.rollout_faults import attach_from_env

    workers.install()
    if _record_model not in mcore.MODEL_LISTENERS:
        mcore.MODEL_LISTENERS.append(_record_model)
    for hook in (_record_vllm_groups, attach_from_env):
        if hook not in engine.ENGINE_HOOKS:
            engine.ENGINE_HOOKS.append(hook)
    _record_lifecycle()
    _record_checkpoint_loads()
    _record_stages()
    _record_expert_load()
    _record_weight_checks()
    _plant_actor_fault()
    _shuffle_rewards()
    _record("stand-ins installed")


install()
