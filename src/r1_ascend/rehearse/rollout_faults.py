"""Rollout faults the guard and the weight-sync check exist for, planted at one weight sync of the CPU rollout.

Each fault is one way the rollout can decode from a policy other than the actor's while producing fluent text: the
classes seen in the issue trackers of this stack (a sync that was skipped or left some layers stale, expert weights
swapped or mis-laid after wake-up, MLA's derived matrices not recomputed, the two engines configured differently).
Each is planted where its class lives (``where``): in the actor's export stream (the HF-named tensors verl's
``per_tensor_generator`` emitted, before the rollout receives them), in vLLM's DeepSeek-V3 loader while that sync's
``load_weights`` runs, in vLLM's parameters after the load (post-processing), in the engine's MLA re-derivation, or
in the engine's configuration; never in the model that decodes, never in the actor. The weight faults' planting
code is :mod:`r1_ascend.rehearse.weight_faults`. Used by the guard's calibration
(:mod:`r1_ascend.rehearse.guard_calibration`, ``benchmarks/rollout_guard_bench.py``), the rehearsal's
``--rollout-fault`` and their tests.
"""

from __future__ import annotations

import contextlib
import math
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from r1_ascend.rehearse import weight_faults as wf
from r1_ascend.rehearse.weight_faults import RolloutFaultError, bias_names

if TYPE_CHECKING:  # torch is imported where a tensor is made: `rehearse --help` reads FAULTS without it
    import torch

__all__ = ["FAULTS", "RolloutFault", "RolloutFaultError", "Sync", "bias_names", "get", "sync"]

Weights = dict[str, "torch.Tensor"]


#: A change to vLLM's DeepSeek-V3 model held while its ``load_weights`` runs for one sync (a layout fault)
LoaderChange = Callable[["torch.nn.Module"], contextlib.AbstractContextManager[None]]


@dataclass(frozen=True)
class Sync:
    """One weight sync into the engine: the weights to load, for the MLA fault whether to re-derive, and for the
    layout faults the change vLLM's loader runs under."""

    weights: Weights
    recompute_mla: bool = True
    in_loader: LoaderChange | None = None


@dataclass(frozen=True)
class RolloutFault:
    name: str
    what: str
    #: (engine, this sync's weights, the previous sync's weights, probe prompts) -> the sync that happens instead
    plant: Callable[[Any, Weights, Weights, list[list[int]]], Sync]
    #: planted into every sync from the first one on, "previous" staying the weights of the sync before it (a stale
    #: part of the engine that never catches up); otherwise into that one sync only
    persistent: bool = False
    #: where it is planted: "export" (the stream the actor emits), "loader" (vLLM's load_weights), "engine" (vLLM's
    #: parameters after the load, or the MLA re-derivation), "config" (the engine's model configuration)
    where: str = "engine"
    #: the parallel layout it needs beyond one rank (None: any); others refuse it with RolloutFaultError
    needs: str | None = None
    #: for a fault of the engine's configuration: the ``hf_overrides`` that give the engine this configuration when it
    #: is built (config.json's fields -> the fields to override), where the fault's class lives; ``plant`` makes the
    #: same change to a built engine at one sync, to measure what the log-prob guard sees of it
    engine_overrides: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None


def _layer(name: str) -> int | None:
    parts = name.split(".")
    return int(parts[2]) if len(parts) > 2 and parts[:2] == ["model", "layers"] else None


def _moe_layer(engine: Any) -> int:
    """The first MoE layer: where a per-layer fault lands."""
    return int(engine.hf_config.first_k_dense_replace)


def expert_loads(engine: Any, prompts: list[list[int]]) -> dict[int, Counter[int]]:
    """Tokens routed to each expert of each MoE layer when the engine reads ``prompts`` (its current weights)."""
    import torch
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

    loads: dict[int, Counter[int]] = {}
    hooks = []
    for index, layer in enumerate(engine.model.model.layers):
        gate = getattr(layer.mlp, "gate", None)
        if isinstance(gate, DeepseekV3TopkRouter):
            loads[index] = Counter()
            update = loads[index].update
            hooks.append(gate.register_forward_hook(lambda _m, _i, out, u=update: u(out[0].flatten().tolist())))
    try:
        with torch.no_grad():
            for ids in prompts:
                engine.model(input_ids=torch.tensor([ids]))
    finally:
        for hook in hooks:
            hook.remove()
    return loads


def typical_expert(engine: Any, prompts: list[list[int]]) -> tuple[int, int, int]:
    """(layer, expert, partner) for a one-expert fault: in the first MoE layer, the expert whose share of the routed
    tokens is closest to a balanced share (top_k / n_experts, about 3 % on DeepSeek-V3), and the least used other
    expert. A tiny random model routes most tokens to a few experts; the fault should hit a typical one."""
    if not prompts:
        msg = "a per-expert fault picks its expert by routing prompts: plant it in a sync after a generation (>= 2)"
        raise ValueError(msg)
    config = engine.hf_config
    layer = _moe_layer(engine)
    load = expert_loads(engine, prompts)[layer]
    total = sum(load.values()) or 1
    balanced = int(config.num_experts_per_tok) / int(config.n_routed_experts)
    used = [e for e in range(int(config.n_routed_experts)) if load[e] > 0]
    expert = min(used, key=lambda e: (abs(load[e] / total - balanced), e))
    partner = min((e for e in range(int(config.n_routed_experts)) if e != expert), key=lambda e: (load[e], e))
    return layer, expert, partner


def _vllm_model(engine: Any) -> Any:
    """vLLM's DeepSeek-V3 model the engine loads through (a loader or engine fault is planted there)."""
    model = engine.model.vllm_loader.model
    if model is None:
        msg = (
            "this rollout fault is planted in vLLM's DeepSeek-V3 model, but the engine loads without it: the engine "
            "builds vLLM's model only inside a torch.distributed world and with R1_ASCEND_ROLLOUT_VLLM_LOADER=1 "
            "(the default)"
        )
        raise RolloutFaultError(msg)
    return model


def _in_vllm(engine: Any, weights: Weights, change: LoaderChange) -> Sync:
    _vllm_model(engine)
    return Sync(dict(weights), in_loader=change)


def _not_synced(engine: Any, weights: Weights, _previous: Weights, _probe: list[list[int]]) -> Sync:
    """The sync never reaches vLLM's model: the engine keeps the previous step's weights."""
    return _in_vllm(engine, weights, wf.load_never_reaching)


def _previous_sent(_engine: Any, _weights: Weights, previous: Weights, _probe: list[list[int]]) -> Sync:
    """The export sends the previous sync's tensors (a stale send buffer)."""
    return Sync(dict(previous))


def _stale_layers(engine: Any, weights: Weights, _previous: Weights, _probe: list[list[int]]) -> Sync:
    """vLLM's loader writes nothing into the last two decoder layers (a bucket of the sync never applied)."""
    count = int(engine.hf_config.num_hidden_layers)
    return _in_vllm(engine, weights, wf.layers_left_unwritten({count - 2, count - 1}))


def _expert_swap(engine: Any, weights: Weights, _previous: Weights, probe: list[list[int]]) -> Sync:
    """vLLM's loader takes two experts of one layer for each other (an expert-index mapping off by a permutation)."""
    layer, expert, partner = typical_expert(engine, probe)
    return _in_vllm(engine, weights, wf.experts_exchanged(layer, expert, partner))


def _expert_transposed(engine: Any, weights: Weights, _previous: Weights, probe: list[list[int]]) -> Sync:
    """After the load, one expert's down projection lies transposed in the same shape (the class of "expert
    weights transposed twice" after wake-up)."""
    layer, expert, _partner = typical_expert(engine, probe)
    return _in_vllm(engine, weights, wf.expert_transposed_in_memory(layer, expert))


def _expert_negated(engine: Any, weights: Weights, _previous: Weights, probe: list[list[int]]) -> Sync:
    """After the load, one expert's down projection has its sign flipped (a sign lost in a layout conversion)."""
    layer, expert, _partner = typical_expert(engine, probe)
    return _in_vllm(engine, weights, wf.expert_negated_in_memory(layer, expert))


def _stale_bias(_engine: Any, weights: Weights, previous: Weights, _probe: list[list[int]]) -> Sync:
    """Every expert bias of the stream kept at the value of the sync before the fault: an export that carries
    parameters only (the bias is a megatron-core buffer, exported from the state_dict, not named_parameters), or a
    bias read once. The engine then routes with a bias the actor has moved away from."""
    stale = dict(weights)
    for name in bias_names(weights):
        stale[name] = previous[name]
    return Sync(stale)


def _bias_missing(_engine: Any, weights: Weights, _previous: Weights, _probe: list[list[int]]) -> Sync:
    """The stream leaves the routers' expert bias out."""
    return Sync(wf.without_bias(weights))


def _converter_gate_up(_engine: Any, weights: Weights, _previous: Weights, _probe: list[list[int]]) -> Sync:
    """The converter splits the dense and shared-expert ``linear_fc1`` up-first (gate_proj <-> up_proj)."""
    return Sync(wf.gate_up_exchanged(weights))


def _converter_mla_norm(engine: Any, weights: Weights, _previous: Weights, _probe: list[list[int]]) -> Sync:
    """The converter names each layer's ``kv_a_layernorm`` with the next layer's index."""
    return Sync(wf.mla_norms_shifted(weights, int(engine.hf_config.num_hidden_layers)))


def _ep_gather_shifted(engine: Any, weights: Weights, _previous: Weights, _probe: list[list[int]]) -> Sync:
    """A wrong EP gather: each actor EP rank's experts are named with the next rank's ids."""
    return Sync(wf.experts_renamed_by_ep_block(weights, int(engine.hf_config.n_routed_experts)))


def _stale_stage(_engine: Any, _weights: Weights, _previous: Weights, _probe: list[list[int]]) -> Sync:
    """Planted in verl's PP broadcast during the export, not in the engine's sync: a harness that runs the actor at
    PP >= 2 holds :class:`weight_faults.StalePipelineStage` around each export (tests/model/weight_check_child.py)."""
    msg = (
        "stale-stage is planted in verl's PP broadcast during the export (weight_faults.StalePipelineStage around "
        "the actor's per_tensor_generator at PP >= 2), not in the rollout engine's sync"
    )
    raise RolloutFaultError(msg)


def _kv_b_proj_halves(engine: Any, weights: Weights, _previous: Weights, _probe: list[list[int]]) -> Sync:
    """vLLM's loader is handed one layer's ``kv_b_proj`` with the two halves of its output rows swapped."""
    return _in_vllm(engine, weights, wf.kv_b_proj_halves(_moe_layer(engine)))


def _tp_shards_swapped(engine: Any, weights: Weights, _previous: Weights, _probe: list[list[int]]) -> Sync:
    """At rollout TP >= 2, vLLM's loader narrows one ``q_b_proj`` at the next rank's offset."""
    return _in_vllm(engine, weights, wf.tp_shards_swapped(_vllm_model(engine), _moe_layer(engine)))


def _expert_wrong_rank(engine: Any, weights: Weights, _previous: Weights, _probe: list[list[int]]) -> Sync:
    """At EP >= 2, each EP rank loads the next rank's first expert into its own first slot."""
    return _in_vllm(engine, weights, wf.expert_on_wrong_rank(_vllm_model(engine)))


def _experts_transposed_again(engine: Any, weights: Weights, _previous: Weights, _probe: list[list[int]]) -> Sync:
    """The post-processing of this sync (planted in one after the rollout's release / resume: the second or later)
    transposes the experts' layout again."""
    return _in_vllm(engine, weights, wf.experts_transposed_again)


def _mla_not_recomputed(_engine: Any, weights: Weights, _previous: Weights, _probe: list[list[int]]) -> Sync:
    """``kv_b_proj`` is loaded, but MLA's derived ``W_UK_T``/``W_UV`` keep the previous step's values."""
    return Sync(dict(weights), recompute_mla=False)


def _routing_ungrouped(engine: Any, weights: Weights, _previous: Weights, _probe: list[list[int]]) -> Sync:
    """The engine routes over all experts instead of the top ``topk_group`` of ``n_group`` groups."""
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

    for module in engine.model.modules():
        if isinstance(module, DeepseekV3TopkRouter):
            module.topk_group = module.n_group
    return Sync(dict(weights))


def _yarn_off(engine: Any, weights: Weights, _previous: Weights, _probe: list[list[int]]) -> Sync:
    """The engine's rope without yarn scaling (plain rope frequencies, no attention-scale correction)."""
    import copy

    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3RotaryEmbedding

    config = copy.deepcopy(engine.hf_config)
    config.rope_scaling = None
    engine.model.model.rotary_emb = DeepseekV3RotaryEmbedding(config)
    for layer in engine.model.model.layers:
        layer.self_attn.scaling = 1.0 / math.sqrt(layer.self_attn.qk_head_dim)
    return Sync(dict(weights))


def _sampler_unpatched(engine: Any, weights: Weights, _previous: Weights, _probe: list[list[int]]) -> Sync:
    """From this sync on the engine samples with vLLM 0.9.1's ``Sampler.forward`` as upstream ships it: the same
    tokens, reported with the log-probs of the logits before temperature (the overlay's sampler patch lost, as a
    vLLM whose sampler moved would lose it)."""
    from vllm.v1.sample.sampler import Sampler

    from r1_ascend.patches import get_original, patched_by

    forward = Sampler.forward
    if patched_by(forward) is not None:
        forward = get_original(f"{Sampler.__module__}.Sampler.forward")
    engine.sampler = type("UpstreamSampler", (Sampler,), {"forward": forward})()
    return Sync(dict(weights))


# --- layout faults, planted in vLLM's DeepSeek-V3 loader (the engine's ``vllm_loader``) ---------------------------


def _fused_moe_layers(model: torch.nn.Module) -> list[Any]:
    from vllm.model_executor.layers.fused_moe import FusedMoE

    return [module for module in model.modules() if isinstance(module, FusedMoE)]


@contextlib.contextmanager
def _expert_loaders_wrapped(model: torch.nn.Module, param_name: str, wrap: Callable[..., Any]) -> Iterator[None]:
    """Each MoE layer's ``param_name`` loads through ``wrap(loader, ...)`` instead of ``FusedMoE.weight_loader``;
    restored afterwards. vLLM's ``load_weights`` reads ``param.weight_loader`` on every expert tensor
    (``deepseek_v2.py:802`` in vLLM 0.9.1), so the change acts where upstream's loader does."""
    params = [getattr(layer, param_name) for layer in _fused_moe_layers(model)]
    saved = [(param, param.weight_loader) for param in params]
    for param, loader in saved:
        param.weight_loader = lambda *args, _loader=loader, **kwargs: wrap(_loader, *args, **kwargs)
    try:
        yield
    finally:
        for param, loader in saved:
            param.weight_loader = loader


def _gate_up_exchanged(model: torch.nn.Module) -> contextlib.AbstractContextManager[None]:
    """Every expert's gate projection written into the up half of ``w13`` and its up projection into the gate half
    (the loader's ``w1``/``w3`` shard ids exchanged)."""
    exchanged = {"w1": "w3", "w3": "w1"}

    def load(loader: Callable[..., Any], *args: Any, shard_id: str, **kwargs: Any) -> Any:
        return loader(*args, shard_id=exchanged.get(shard_id, shard_id), **kwargs)

    return _expert_loaders_wrapped(model, "w13_weight", load)


@contextlib.contextmanager
def _expert_map_shifted(model: torch.nn.Module) -> Iterator[None]:
    """While the weights load, each MoE layer's expert map is shifted by one: expert ``e``'s weights land in the
    slot (and, under EP, on the rank) of expert ``e - 1``. Its kernels keep routing through the layer's own map."""
    import torch

    layers = _fused_moe_layers(model)
    saved = [(layer, layer.expert_map) for layer in layers]
    for layer, expert_map in saved:
        current = expert_map if expert_map is not None else torch.arange(int(layer.global_num_experts))
        layer.expert_map = torch.roll(current, 1)
    try:
        yield
    finally:
        for layer, expert_map in saved:
            layer.expert_map = expert_map


def _in_loader(change: LoaderChange) -> Callable[[Any, Weights, Weights, list[list[int]]], Sync]:
    return lambda engine, weights, _previous, _probe: _in_vllm(engine, weights, change)


@contextlib.contextmanager
def loader_change(engine: Any, planned: Sync) -> Iterator[None]:
    """While a sync of ``engine`` (a ``CPUStandInLLM``) loads: ``planned``'s change to vLLM's loader, held by the
    engine's ``vllm_loader`` around vLLM's ``load_weights`` only (the read-back sees the model as its kernels do).
    Nothing for a fault that is not a layout fault."""
    if planned.in_loader is None:
        yield
        return
    loader = engine.model.vllm_loader
    if loader.model is None:
        msg = (
            "this rollout fault is planted in vLLM's DeepSeek-V3 load_weights, but the engine loads without it: "
            "the engine builds vLLM's model only inside a torch.distributed world and with "
            "R1_ASCEND_ROLLOUT_VLLM_LOADER=1 (the default)"
        )
        raise RolloutFaultError(msg)
    loader.change = planned.in_loader
    try:
        yield
    finally:
        loader.change = None


FAULTS: Mapping[str, RolloutFault] = {
    f.name: f
    for f in (
        RolloutFault(
            "not-synced",
            "the sync never reaches vLLM's model (the engine keeps the previous step's weights)",
            _not_synced,
            where="loader",
        ),
        RolloutFault(
            "previous-sync-sent", "the export sends the previous sync's tensors", _previous_sent, where="export"
        ),
        RolloutFault(
            "stale-layers", "vLLM's loader writes nothing into the last two layers", _stale_layers, where="loader"
        ),
        RolloutFault(
            "expert-swap",
            "vLLM's loader takes a typical expert of the first MoE layer for another and back",
            _expert_swap,
            where="loader",
        ),
        RolloutFault(
            "expert-transposed",
            "after the load one expert's down_proj lies transposed in memory (same shape)",
            _expert_transposed,
        ),
        RolloutFault("expert-negated", "after the load one expert's down_proj has its sign flipped", _expert_negated),
        RolloutFault(
            "stale-bias",
            "the stream's expert bias kept at its value before the fault, in this sync and every later one",
            _stale_bias,
            persistent=True,
            where="export",
        ),
        RolloutFault("bias-missing", "the stream leaves the routers' expert bias out", _bias_missing, where="export"),
        RolloutFault(
            "converter-gate-up",
            "the converter splits the dense and shared-expert fc1 up-first (gate_proj <-> up_proj)",
            _converter_gate_up,
            where="export",
        ),
        RolloutFault(
            "converter-mla-norm",
            "the converter names each layer's kv_a_layernorm with the next layer's index",
            _converter_mla_norm,
            where="export",
        ),
        RolloutFault(
            "ep-gather-shifted",
            "a wrong EP gather: each actor EP rank's experts named with the next rank's ids",
            _ep_gather_shifted,
            where="export",
            needs="actor EP >= 2",
        ),
        RolloutFault(
            "stale-stage",
            "verl's PP broadcast replays what a rank received from the other stage in the sync before",
            _stale_stage,
            where="export",
            needs="actor PP >= 2",
        ),
        RolloutFault(
            "kv-b-proj-halves",
            "vLLM's loader is handed kv_b_proj of one layer with its output halves swapped",
            _kv_b_proj_halves,
            where="loader",
        ),
        RolloutFault(
            "mla-not-recomputed", "MLA's absorbed W_UK_T/W_UV not recomputed after the update", _mla_not_recomputed
        ),
        RolloutFault(
            "routing-ungrouped",
            "group-limited routing off in the engine",
            _routing_ungrouped,
            where="config",
            engine_overrides=lambda config: {"topk_group": config["n_group"]},
        ),
        RolloutFault(
            "yarn-off",
            "yarn rope scaling off in the engine",
            _yarn_off,
            where="config",
            engine_overrides=lambda _config: {"rope_scaling": None},
        ),
        RolloutFault(
            "sampler-unpatched",
            "vLLM's sampler without the overlay's patch: log-probs of the logits before temperature",
            _sampler_unpatched,
            where="config",
        ),
        RolloutFault(
            "w13-swap",
            "vLLM's loader writes every expert's gate projection into the up half of w13 and up into the gate half",
            _in_loader(_gate_up_exchanged),
            where="loader",
        ),
        RolloutFault(
            "wrong-ep-rank",
            "vLLM's loader places each expert through an expert map shifted by one (another slot, another EP rank)",
            _in_loader(_expert_map_shifted),
            where="loader",
        ),
        RolloutFault(
            "expert-wrong-rank",
            "each EP rank's loader puts the next rank's first expert into its own first slot",
            _expert_wrong_rank,
            where="loader",
            needs="EP >= 2",
        ),
        RolloutFault(
            "tp-shards-swapped",
            "vLLM's loader narrows one layer's q_b_proj at the next TP rank's offset",
            _tp_shards_swapped,
            where="loader",
            needs="rollout TP >= 2",
        ),
        RolloutFault(
            "expert-transposed-load",
            "vLLM's loader is handed expert 0's down_proj transposed and laid back into its shape, every MoE layer",
            _in_loader(wf.expert_handed_transposed(0)),
            where="loader",
        ),
        RolloutFault(
            "moe-loader-dropped",
            "the experts' weight_loader missing in vLLM's model and the update skipping their tensors",
            _in_loader(wf.expert_loaders_skipped),
            where="loader",
        ),
        RolloutFault(
            "expert-transposed-resume",
            "the experts' layout transposed again by the post-processing of a sync after a release / resume cycle",
            _experts_transposed_again,
        ),
    )
}


def get(name: str) -> RolloutFault:
    if name not in FAULTS:
        msg = f"unknown rollout fault {name!r}; known: {', '.join(FAULTS)}"
        raise KeyError(msg)
    return FAULTS[name]


def sync(
    engine: Any,
    weights: Weights,
    previous: Weights | None = None,
    fault: RolloutFault | None = None,
    probe: list[list[int]] | None = None,
) -> str | None:
    """Load one step's weights into the engine (``CPUStandInLLM``) as the overlay's ``update_weights`` does, with
    ``fault`` planted in this sync (``previous``: the weights of the sync before, for the stale faults; ``probe``:
    prompts whose routing picks the expert of the per-expert faults), then run the weight-sync check as the worker
    does after the sync. Returns the check's stop message (None: it passed, or its patch is not applied), so a
    caller can go on and measure what the guard sees of the same fault."""
    from r1_ascend.patches import WeightSyncError
    from r1_ascend.patches.impl import weight_check

    planned = Sync(weights) if fault is None else fault.plant(engine, weights, previous or weights, probe or [])
    with loader_change(engine, planned):
        loaded = engine.load_weights(planned.weights.items(), recompute_mla=planned.recompute_mla)
    try:
        weight_check.verify(engine.runner.forward_context)
    except WeightSyncError as stopped:
        return str(stopped)
    engine.model.check_complete(loaded)
    return None


# --- planting a fault into the rehearsal's engine -----------------------------------------------------------------


def parse_spec(spec: str) -> tuple[RolloutFault, int]:
    """``NAME@SYNC`` (e.g. ``stale-layers@2``): the fault and the 1-based weight sync it is planted in."""
    name, _, at = spec.partition("@")
    if not at.isdigit() or int(at) < 1:
        msg = f"rollout fault {spec!r}: expected NAME@SYNC with SYNC >= 1, e.g. stale-layers@2"
        raise ValueError(msg)
    return get(name), int(at)


class Planter:
    """Plants one fault into one weight sync of a ``CPUStandInLLM``, whoever drives the sync (the overlay's
    ``update_weights`` in the rehearsal): wraps ``model.load_weights``, keeps the previous sync's weights for the
    stale faults, and for ``mla-not-recomputed`` puts the previous MLA matrices back after the overlay re-derives
    them. Probe prompts for the per-expert faults: the last prompts the engine generated for."""

    def __init__(self, llm: Any, fault: RolloutFault, at_sync: int) -> None:
        self.llm, self.fault, self.at_sync = llm, fault, at_sync
        self.syncs = 0
        self.previous: Weights | None = None
        #: a persistent fault's "previous" weights: those of the sync before it was first planted
        self.before_fault: Weights | None = None
        self.planted_in: int | None = None
        self._load = llm.model.load_weights
        llm.model.load_weights = self.load_weights

    def load_weights(self, weights: Any) -> set[str]:
        current = {name: tensor.detach().clone() for name, tensor in weights}
        self.syncs += 1
        planned = Sync(current)
        if self.syncs == self.at_sync or (self.fault.persistent and self.syncs > self.at_sync):
            if self.fault.persistent and self.syncs > self.at_sync:
                previous = self.before_fault or current
            else:
                previous = self.previous or current
                self.before_fault = previous
            planned = self.fault.plant(self.llm, current, previous, list(self.llm.last_prompts))
            if self.planted_in is None:
                self.planted_in = self.syncs
                print(
                    f"rollout fault: planted {self.fault.name} ({self.fault.what}) in weight sync {self.syncs}",
                    flush=True,
                )
            if not planned.recompute_mla:
                self._keep_mla_matrices()
        self.previous = current
        with loader_change(self.llm, planned):
            return self._load(planned.weights.items())

    def _keep_mla_matrices(self) -> None:
        """The next ``process_weights_after_loading`` of each MLA layer restores the matrices it has now."""
        from r1_ascend.patches.impl.rollout_memory import MLA_DERIVED_MATRICES, mla_impls

        for impl in mla_impls(self.llm.runner.forward_context):
            kept = {attr: getattr(impl, attr).clone() for attr in MLA_DERIVED_MATRICES}

            def restore(_act_dtype: Any, impl: Any = impl, kept: dict[str, torch.Tensor] = kept) -> None:
                for attr, value in kept.items():
                    setattr(impl, attr, value)
                del impl.process_weights_after_loading  # back to the class's method for later syncs

            impl.process_weights_after_loading = restore


def plant_from_env(llm: Any) -> Planter | None:
    """The rehearsal's ``--rollout-fault``: read ``R1_ASCEND_REHEARSE_ROLLOUT_FAULT`` (``NAME@SYNC``) and plant it."""
    from r1_ascend import envs

    spec = envs.rehearse_rollout_fault()
    if spec is None:
        return None
    fault, at_sync = parse_spec(spec)
    return Planter(llm, fault, at_sync)


def attach_from_env(llm: Any) -> None:
    """An entry of ``r1_ascend.cpu.engine.ENGINE_HOOKS``: the engine's ``fault`` is the planter of
    :func:`plant_from_env`."""
    llm.fault = plant_from_env(llm)
