"""Weight and layout faults planted where their class lives: in the actor's export stream, in verl's PP broadcast,
in vLLM's DeepSeek-V3 loader, or in vLLM's parameters after the load; never in the model that decodes.

Each loader or engine fault is a change to vLLM's model held while its ``load_weights`` runs for one sync
(:data:`r1_ascend.rehearse.rollout_faults.LoaderChange`): a parameter's ``weight_loader`` wrapped, skipped or fed
another tensor, the load never reaching the model, or, on leaving, the parameters changed as a post-processing
step would change them. Each export fault changes the stream (the HF-named tensors verl's ``per_tensor_generator``
emitted) before the rollout receives it. The catalogue (names, what each plants) is
:data:`r1_ascend.rehearse.rollout_faults.FAULTS`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported where a tensor is changed: `rehearse --help` reads the faults without it
    import torch

Weights = dict[str, "torch.Tensor"]


class RolloutFaultError(RuntimeError):
    """A fault cannot be planted into this engine or world (its parallel sizes lack what the fault needs)."""


# --- vLLM's loader ------------------------------------------------------------------------------------------------


def fused_moe_layers(model: torch.nn.Module) -> dict[int, Any]:
    """Decoder layer -> its ``FusedMoE`` module in vLLM's model."""
    from vllm.model_executor.layers.fused_moe import FusedMoE

    return {int(name.split(".")[2]): module for name, module in model.named_modules() if isinstance(module, FusedMoE)}


def _noop(*_args: Any, **_kwargs: Any) -> None:
    """A weight loader that writes nothing: the parameter keeps what it held."""


@contextlib.contextmanager
def loaders_replaced(model: torch.nn.Module, select: Callable[[str], bool], wrap: Callable[..., Any]) -> Iterator[None]:
    """While the weights load, each parameter whose name ``select`` accepts loads through ``wrap(loader, *args,
    **kwargs)`` (``loader``: its own ``weight_loader``, or vLLM's ``default_weight_loader`` which its
    ``load_weights`` falls back to); restored afterwards."""
    from vllm.model_executor.model_loader.weight_utils import default_weight_loader

    saved = []
    for name, param in model.named_parameters():
        if select(name):
            own = param.__dict__.get("weight_loader")
            loader = own if own is not None else default_weight_loader
            param.weight_loader = lambda *a, _loader=loader, **k: wrap(_loader, *a, **k)
            saved.append((param, own))
    try:
        yield
    finally:
        for param, own in saved:
            if own is None:
                del param.weight_loader
            else:
                param.weight_loader = own


def layers_left_unwritten(layers: set[int]) -> Callable[[torch.nn.Module], contextlib.AbstractContextManager[None]]:
    """The loader writes nothing into these decoder layers (a bucket of the sync never applied)."""
    prefixes = tuple(f"model.layers.{layer}." for layer in sorted(layers))
    return lambda model: loaders_replaced(model, lambda name: name.startswith(prefixes), lambda *_a, **_k: None)


def experts_exchanged(layer: int, first: int, second: int) -> Callable[[torch.nn.Module], Any]:
    """The loader of one MoE layer takes expert ``first`` for ``second`` and back (an expert-index mapping off by
    a permutation)."""
    exchange = {first: second, second: first}
    prefix = f"model.layers.{layer}.mlp.experts."

    def load(loader: Callable[..., Any], *args: Any, expert_id: int, **kwargs: Any) -> Any:
        return loader(*args, expert_id=exchange.get(int(expert_id), int(expert_id)), **kwargs)

    return lambda model: loaders_replaced(model, lambda name: name.startswith(prefix) and "_weight" in name, load)


def expert_handed_transposed(expert: int) -> Callable[[torch.nn.Module], Any]:
    """Every MoE layer's ``down_proj`` of ``expert`` handed to ``FusedMoE.weight_loader`` transposed and laid back
    into its shape (a layout conversion the kernels do not expect): the shapes fit, so the loader copies it."""

    def load(loader: Callable[..., Any], param: Any, weight: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if int(kwargs.get("expert_id", -1)) == expert:
            weight = weight.t().contiguous().view(weight.shape)
        return loader(param, weight, *args, **kwargs)

    return lambda model: loaders_replaced(model, lambda name: name.endswith(".experts.w2_weight"), load)


def expert_loaders_skipped(model: torch.nn.Module) -> contextlib.AbstractContextManager[None]:
    """The experts' ``w13_weight`` / ``w2_weight`` have lost their ``weight_loader`` and the update skips the
    tensors of parameters without one (an online update over vllm-ascend's re-created parameters; vllm-ascend
    #13337): the experts keep the previous sync's weights."""
    return loaders_replaced(model, lambda name: name.endswith((".experts.w13_weight", ".experts.w2_weight")), _noop)


def kv_b_proj_halves(layer: int) -> Callable[[torch.nn.Module], Any]:
    """One layer's ``kv_b_proj`` handed to its loader with the two halves of its output rows swapped (a split /
    merge layout bug)."""

    def load(loader: Callable[..., Any], param: Any, weight: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        import torch

        first, second = weight.chunk(2, dim=0)
        return loader(param, torch.cat([second, first], dim=0), *args, **kwargs)

    name = f"model.layers.{layer}.self_attn.kv_b_proj.weight"
    return lambda model: loaders_replaced(model, lambda n: n == name, load)


def tp_shards_swapped(model: torch.nn.Module, layer: int) -> Callable[[torch.nn.Module], Any]:
    """At rollout TP >= 2, one layer's ``q_b_proj`` loaded with its TP shards exchanged: rank ``r`` takes rank
    ``r + 1``'s rows (the loader narrows the tensor at another rank's offset)."""
    name = f"model.layers.{layer}.self_attn.q_b_proj.weight"
    tp = int(dict(model.named_modules())[name.removesuffix(".weight")].tp_size)
    if tp < 2:
        msg = "tp-shards-swapped exchanges the TP shards of one tensor: it needs rollout TP >= 2"
        raise RolloutFaultError(msg)

    def load(loader: Callable[..., Any], param: Any, weight: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        import torch

        return loader(param, torch.roll(weight, -weight.shape[0] // tp, dims=0), *args, **kwargs)

    return lambda vllm_model: loaders_replaced(vllm_model, lambda n: n == name, load)


def expert_on_wrong_rank(model: torch.nn.Module) -> Callable[[torch.nn.Module], Any]:
    """At EP >= 2, every EP rank loads the first expert of the next rank into its own first slot, in every MoE
    layer (an expert placed on the wrong EP rank): its own first expert is never loaded."""
    module = next(iter(fused_moe_layers(model).values()))
    ep, rank, local = int(module.ep_size), int(module.ep_rank), int(module.local_num_experts)
    if ep < 2:
        msg = "expert-wrong-rank loads an expert on another EP rank: it needs EP >= 2"
        raise RolloutFaultError(msg)
    own, foreign = rank * local, ((rank + 1) % ep) * local

    def load(loader: Callable[..., Any], *args: Any, expert_id: int, **kwargs: Any) -> Any:
        if int(expert_id) == own:
            return None
        return loader(*args, expert_id=own if int(expert_id) == foreign else int(expert_id), **kwargs)

    def select(name: str) -> bool:
        return name.endswith(("experts.w13_weight", "experts.w2_weight"))

    return lambda vllm_model: loaders_replaced(vllm_model, select, load)


@contextlib.contextmanager
def load_never_reaching(model: torch.nn.Module) -> Iterator[None]:
    """The sync's stream is consumed but never reaches vLLM's ``load_weights`` (a skipped ``update_weights``):
    every parameter keeps the previous sync's weights, and the load reports every parameter as written."""

    def skipped(weights: Any) -> set[str]:
        for _ in weights:
            pass
        return {name for name, _ in model.named_parameters()}

    model.load_weights = skipped
    try:
        yield
    finally:
        del model.load_weights


# --- vLLM's parameters after the load (post-processing) ---------------------------------------------------------


@contextlib.contextmanager
def after_load(model: torch.nn.Module, change: Callable[[torch.nn.Module], None]) -> Iterator[None]:
    """The load runs as is; then ``change`` acts on vLLM's parameters, as a post-processing step would."""
    import torch

    yield
    with torch.no_grad():
        change(model)


def _local_slot(module: Any, expert: int) -> int | None:
    expert_map = getattr(module, "expert_map", None)
    if expert_map is None:
        return expert
    slot = int(expert_map[expert])
    return slot if slot >= 0 else None


def _relaid_transposed(tensor: torch.Tensor) -> None:
    """``tensor`` (one expert's matrix) re-laid as its transpose in the same shape, in place."""
    tensor.copy_(tensor.t().contiguous().view(tensor.shape))


def expert_transposed_in_memory(layer: int, expert: int) -> Callable[[torch.nn.Module], Any]:
    """After the load, one expert's ``w2`` slot holds its transpose laid out in the same shape."""

    def change(model: torch.nn.Module) -> None:
        module = fused_moe_layers(model)[layer]
        slot = _local_slot(module, expert)
        if slot is not None:
            _relaid_transposed(module.w2_weight.data[slot])

    return lambda model: after_load(model, change)


def expert_negated_in_memory(layer: int, expert: int) -> Callable[[torch.nn.Module], Any]:
    """After the load, one expert's ``w2`` slot holds its negation (a sign lost in a layout conversion)."""

    def change(model: torch.nn.Module) -> None:
        module = fused_moe_layers(model)[layer]
        slot = _local_slot(module, expert)
        if slot is not None:
            module.w2_weight.data[slot].neg_()

    return lambda model: after_load(model, change)


def experts_transposed_again(model: torch.nn.Module) -> contextlib.AbstractContextManager[None]:
    """After a release / resume cycle, the post-processing transposes the expert layout once more: every expert's
    ``w13`` and ``w2`` slot holds its transpose laid out in the same shape (vllm-ascend #11548, #12226)."""

    def change(vllm_model: torch.nn.Module) -> None:
        for module in fused_moe_layers(vllm_model).values():
            for param in (module.w13_weight, module.w2_weight):
                for slot in range(param.shape[0]):
                    _relaid_transposed(param.data[slot])

    return after_load(model, change)


# --- the actor's export stream ------------------------------------------------------------------------------------


def bias_names(weights: Weights) -> list[str]:
    """The routers' expert-bias tensors of a sync (HF names)."""
    return [name for name in weights if name.endswith(".mlp.gate.e_score_correction_bias")]


def without_bias(weights: Weights) -> Weights:
    """The stream without the routers' expert bias (an export of ``named_parameters`` only: megatron-core's
    ``router.expert_bias`` is a buffer, which verl adds from the state dict)."""
    dropped = set(bias_names(weights))
    return {name: tensor for name, tensor in weights.items() if name not in dropped}


def gate_up_exchanged(weights: Weights) -> Weights:
    """The converter splits every ``linear_fc1`` of the dense MLPs and the shared experts up-first: each
    ``gate_proj`` carries the ``up_proj`` and back."""
    out = dict(weights)
    for name in weights:
        if name.endswith(".gate_proj.weight") and ".experts." not in name:  # dense and shared, not routed
            up = name.replace(".gate_proj.", ".up_proj.")
            out[name], out[up] = weights[up], weights[name]
    return out


def mla_norms_shifted(weights: Weights, layers: int) -> Weights:
    """The converter names each layer's ``kv_a_layernorm`` with the next layer's index (an off-by-one in its MLA
    names; the last one's goes to layer 0)."""
    out = dict(weights)
    for layer in range(layers):
        source = f"model.layers.{layer}.self_attn.kv_a_layernorm.weight"
        out[f"model.layers.{(layer + 1) % layers}.self_attn.kv_a_layernorm.weight"] = weights[source]
    return out


def experts_renamed_by_ep_block(weights: Weights, experts: int) -> Weights:
    """A wrong EP gather: the experts gathered from each actor EP rank are named with the next rank's expert ids."""
    from megatron.core import parallel_state

    ep = parallel_state.get_expert_model_parallel_world_size()
    if ep < 2:
        msg = "ep-gather-shifted renames the experts of each actor EP rank: it needs actor EP >= 2"
        raise RolloutFaultError(msg)
    step = experts // ep
    out = {}
    for name, tensor in weights.items():
        parts = name.split(".")
        if len(parts) > 5 and parts[3] == "mlp" and parts[4] == "experts" and parts[5].isdigit():
            parts[5] = str((int(parts[5]) + step) % experts)
        out[".".join(parts)] = tensor
    return out


class StalePipelineStage:
    """verl's PP broadcast (``broadcast_from_megatron_pp``, which ``per_tensor_generator`` calls for every tensor)
    replays, in the planted sync, what each rank received from another pipeline stage in the sync before: a stale
    receive buffer (SkyRL #1345). Hold :meth:`export` around every sync's export; needs actor PP >= 2."""

    def __init__(self) -> None:
        self.previous: list[torch.Tensor] = []

    @contextlib.contextmanager
    def export(self, planted: bool) -> Iterator[None]:
        from megatron.core import parallel_state
        from verl.utils import megatron_utils

        if parallel_state.get_pipeline_model_parallel_world_size() < 2:
            msg = "stale-stage replays what a rank received from another pipeline stage: it needs actor PP >= 2"
            raise RolloutFaultError(msg)
        original = megatron_utils.broadcast_from_megatron_pp
        received: list[torch.Tensor] = []

        def broadcast(tensor: Any) -> torch.Tensor:
            out = original(tensor)
            if tensor is None:  # this rank received it from the stage that holds it
                if planted and len(received) < len(self.previous):
                    out.copy_(self.previous[len(received)])  # in place: verl's TP attributes stay on the tensor
                received.append(out.detach().clone())
            return out

        megatron_utils.broadcast_from_megatron_pp = broadcast
        try:
            yield
        finally:
            megatron_utils.broadcast_from_megatron_pp = original
            self.previous = received
