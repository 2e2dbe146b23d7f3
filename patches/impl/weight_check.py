"""Every weight sync checked exactly: what the actor exports against its own shards, what vLLM holds against what it
received (``verl_weight_sync_check``).

One sync, on every rank of the colocated actor / rollout world:

1. :func:`begin_export` (the wrapper of verl's ``per_tensor_generator``): the actor's modules are remembered for
   this sync; nothing is computed yet.
2. :func:`load` (the wrapper of vLLM's ``DeepseekV2ForCausalLM.load_weights``): the ownership rule
   (:mod:`weight_ownership`) says which region of which HF tensor each of this rank's engine tensors holds and how
   every HF tensor is shared among the rollout ranks. The actor **predicts** the fingerprint of each share from its
   own Megatron shards (``sharded_state_dict``: TP / EP / PP offsets; main replicas only), never from the gathered
   tensors, and one float64 all-reduce over the world sums the predictions. Then each tensor of the stream is
   fingerprinted, as it enters vLLM's loader, on the region this rank owns (and on the rows its MLA matrices are
   derived from) before it is handed on unchanged.
3. :func:`verify` (after verl's ``rollout_mode``: the load, vLLM's post-processing, the MLA re-derivation): each
   engine tensor's fingerprint against the received region's (**load check**), each received share against its
   prediction (**export check**), every share received exactly once, every MoE layer's expert map as the rule
   places the experts. The ranks sum their mismatch counts; if any rank found one, every rank raises
   ``WeightSyncError`` naming the first mismatches: rank, sync, HF tensor, engine tensor, both fingerprints.

The fingerprint and its tolerance are :mod:`r1_ascend.patches.rules.weight_fingerprint`; the HF <-> Megatron mapping
the prediction uses is the converter's (:mod:`r1_ascend.patches.rules.mcore_mapping`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from .._errors import WeightSyncError
from ..rules import mcore_mapping
from ..rules import weight_fingerprint as fp
from . import weight_ownership as rule

logger = logging.getLogger(__name__)

#: HF model types whose Megatron export the mapping describes (DeepSeek-V2/V3 layout; others are not checked).
MODEL_TYPES = ("deepseek_v3", "deepseek_v2")
#: Mismatches each rank contributes to the error message.
SHOWN = 4


@dataclass(frozen=True)
class Mismatch:
    """One thing a sync got wrong on one rank."""

    rank: int
    sync: int
    kind: str  # "load" | "export" | "missing" | "layout"
    hf: str
    engine: str
    detail: str

    def message(self) -> str:
        where = {
            "load": "vLLM holds other values than it received",
            "export": "the rollout received other values than the actor's own shards predict",
            "missing": "not received",
            "layout": "the engine's layout leaves the rule",
        }[self.kind]
        return f"rank {self.rank}, sync {self.sync}: {self.hf} -> {self.engine}: {where}: {self.detail}"


@dataclass
class SyncReport:
    """What :func:`verify` found for one sync on this rank, and what it cost."""

    sync: int
    rank: int
    slots: int  # engine tensors (and parts) compared with what they received
    shares: int  # received shares compared with the actor's prediction
    mismatches: list[Mismatch]
    predict_s: float
    receive_s: float
    verify_s: float
    #: the whole sync (verl's rollout_mode, this check included) when measured by the worker; None otherwise
    sync_s: float | None = None

    @property
    def check_s(self) -> float:
        return self.predict_s + self.receive_s + self.verify_s


#: Called as ``listener(report)`` on every rank after each verified sync (the rehearsal records them).
CHECK_LISTENERS: list[Callable[[SyncReport], None]] = []


#: A region's fingerprint on its device: ``[proj, total, abs_total]`` (fp32) and the exact checksum (int64).
Print = tuple[torch.Tensor, torch.Tensor]


@dataclass
class _Export:
    sync: int
    actor_module: list[Any]
    hf_config: dict[str, Any]


@dataclass
class _Received:
    sync: int
    model: Any
    owned: rule.Ownership
    predicted: dict[tuple[str, int], tuple[float, float, int]] | None
    load_prints: dict[int, Print] = field(default_factory=dict)  # slot index -> its received region's
    export_prints: dict[str, Print] = field(default_factory=dict)  # HF name -> this rank's share's, as received
    counts: dict[str, int] = field(default_factory=dict)
    shapes: list[Mismatch] = field(default_factory=list)
    problems: list[Mismatch] = field(default_factory=list)
    predict_s: float = 0.0
    receive_s: float = 0.0


class _State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.syncs = 0
        self.export: _Export | None = None
        self.received: _Received | None = None
        self.unchecked_warned: set[str] = set()
        self.group: Any = None
        self.weights: dict[tuple[Any, ...], Any] = {}


_state = _State()


def reset() -> None:
    """Forget every sync (tests)."""
    global _state
    _state = _State()


# --- 1. the actor's export ----------------------------------------------------------------------------------------


def begin_export(actor_module: list[Any], model_config: Any) -> None:
    """A sync starts: verl's export of ``actor_module`` (HF config ``model_config``) is about to stream."""
    model_type = str(getattr(model_config, "model_type", ""))
    if model_type not in MODEL_TYPES:
        if model_type not in _state.unchecked_warned:
            _state.unchecked_warned.add(model_type)
            logger.warning(
                "weight check: model type %r has no HF <-> Megatron mapping in r1-ascend (DeepSeek-V2/V3 only); "
                "its weight syncs are not checked",
                model_type,
            )
        return
    with _state.lock:
        _state.syncs += 1
        config = model_config.to_dict() if hasattr(model_config, "to_dict") else dict(model_config)
        _state.export = _Export(_state.syncs, list(actor_module), config)
        _state.received = None


# --- 2. the load: predict, then fingerprint the stream ------------------------------------------------------------


def load(model: Any, weights: Iterable[tuple[str, torch.Tensor]], original: Callable[..., Any]) -> Any:
    """vLLM's ``load_weights`` (``original``) on ``weights`` with the check's receiving side around it."""
    with _state.lock:
        export = _state.export
        if export is None:
            _state.syncs += 1
        sync = export.sync if export is not None else _state.syncs
    owned = rule.ownership(model, model.config)
    record = _Received(sync, model, owned, None)
    if export is not None:
        start = time.perf_counter()
        record.problems = _mapping_problems(export, owned, sync)
        record.predicted = predict(export, owned.partition)
        record.predict_s = time.perf_counter() - start
    with _state.lock:
        _state.received = record
    return original(model, _received(record, weights))


def _received(record: _Received, weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    by_hf: dict[str, list[int]] = {}
    for index, slot in enumerate(record.owned.slots):
        by_hf.setdefault(slot.hf, []).append(index)
    for name, tensor in weights:
        start = time.perf_counter()
        record.counts[name] = record.counts.get(name, 0) + 1
        indices = by_hf.get(name, ())
        expected = record.owned.shapes.get(name)
        if indices and expected is not None and tuple(tensor.shape) != expected:
            record.shapes.append(
                Mismatch(0, record.sync, "layout", name, "(received)", f"shape {tuple(tensor.shape)}, not {expected}")
            )
            indices = ()
        for index in indices:
            slot = record.owned.slots[index]
            values = slot.region.of(tensor.detach())
            shape = expected or tuple(tensor.shape)
            cast = values if values.dtype == slot.dtype else values.to(slot.dtype)
            record.load_prints[index] = region_print(cast, name, shape, slot.region, with_abs=True)
            if slot.primary:
                same = cast is values
                record.export_prints[name] = (
                    record.load_prints[index] if same else region_print(values, name, shape, slot.region, with_abs=True)
                )
        record.receive_s += time.perf_counter() - start
        yield name, tensor


def predict(
    export: _Export, partition: Mapping[str, list[rule.Region]]
) -> dict[tuple[str, int], tuple[float, float, int]]:
    """Every share's ``(proj, total, checksum)`` as the actor's own shards give it, summed over the world (float64;
    the checksum exactly, in int64)."""
    from megatron.core.dist_checkpointing.dict_utils import nested_values
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, apply_factories, is_main_replica
    from verl.utils.megatron_utils import unwrap_model

    sources = mcore_mapping.hf_sources(export.hf_config)
    entries = [(hf, k) for hf in sorted(partition) if hf in sources for k in range(len(partition[hf]))]
    index = {entry: i for i, entry in enumerate(entries)}
    tensors = mcore_mapping.by_key(export.hf_config)
    boxes: dict[str, list[mcore_mapping.HFSource]] = {}
    for source in sources.values():
        boxes.setdefault(source.tensor.key, []).append(source)
    prints: list[Print] = []
    rows: list[int] = []
    for chunk in export.actor_module:
        state = unwrap_model(chunk).sharded_state_dict()
        apply_factories(state)
        for shard in nested_values(state):
            if (
                not isinstance(shard, ShardedTensor)
                or shard.key not in tensors
                or not is_main_replica(shard.replica_id)
            ):
                continue
            if shard.flattened_range is not None or tuple(shard.global_shape) != tensors[shard.key].shape:
                msg = (
                    f"weight check: the actor's {shard.key} is {tuple(shard.global_shape)} (flattened "
                    f"{shard.flattened_range}), the mapping's {tensors[shard.key].shape}"
                )
                raise WeightSyncError(msg)
            lead = shard.prepend_axis_num
            box = (1,) * lead + tuple(shard.local_shape)
            for source in _candidates(boxes[shard.key], shard.global_offset, lead):
                hit = source.intersect(tuple(shard.global_offset), box)
                if hit is None or source.name not in partition:
                    continue
                hf_index, shard_index = hit
                part = shard.data.detach()[shard_index[lead:]]
                for k, region in enumerate(partition[source.name]):
                    cut = _cut(hf_index, region)
                    if cut is None:
                        continue
                    local, sub = cut
                    prints.append(region_print(part[local], source.name, source.shape, sub, with_abs=False))
                    rows.append(index[(source.name, k)])
    _same_everywhere(len(entries), "HF tensor shares to predict")
    # proj, total and the checksum in one float64 all-reduce: a checksum term is below 2^31, so the sum over the
    # ranks and regions of a share (fewer than 2^22 terms) stays exact in float64
    totals = torch.zeros((len(entries), 3), dtype=torch.float64)
    if prints:
        at = torch.tensor(rows, dtype=torch.long)
        totals[:, :2].index_add_(0, at, torch.stack([f for f, _ in prints]).to("cpu", torch.float64)[:, :2])
        checks = torch.zeros(len(entries), dtype=torch.int64).index_add_(
            0, at, torch.stack([c for _, c in prints]).cpu()
        )
        totals[:, 2] = torch.remainder(checks, fp.PRIME).to(torch.float64)
    _all_reduce(totals)
    checks = torch.remainder(totals[:, 2].to(torch.int64), fp.PRIME)
    return {entry: (float(totals[i, 0]), float(totals[i, 1]), int(checks[i])) for i, entry in enumerate(entries)}


def _candidates(sources: list[mcore_mapping.HFSource], offset: Any, lead: int) -> list[mcore_mapping.HFSource]:
    """The HF tensors a shard can overlap: for the experts only those of its expert (its leading offset)."""
    if not lead:
        return sources
    return [s for s in sources if s.offset[0] == int(offset[0])]


def _cut(hf_index: tuple[slice, ...], region: rule.Region) -> tuple[tuple[slice, ...], rule.Region] | None:
    """Where a shard's part (``hf_index`` of the HF tensor) meets a share ``region`` (a plain box): the slices of
    the part, and the region of the HF tensor they are."""
    bounds = [region.cols] if region.rows is None else [region.rows, region.cols]
    local, absolute = [], []
    for part, (low, high) in zip(hf_index, bounds, strict=True):
        start, stop = max(part.start, low), min(part.stop, high)
        if start >= stop:
            return None
        local.append(slice(start - part.start, stop - part.start))
        absolute.append((start, stop))
    sub = rule.Region(None, absolute[0]) if region.rows is None else rule.Region(absolute[0], absolute[1])
    return tuple(local), sub


def region_print(x: torch.Tensor, name: str, shape: tuple[int, ...], region: rule.Region, *, with_abs: bool) -> Print:
    """The fingerprint of ``x``, the ``region`` of HF tensor ``name`` (of ``shape``), with that tensor's weights and
    keys (cached per tensor, device and word width)."""
    per = x.element_size() // 2  # 16-bit words per element
    key = (name, tuple(shape), str(x.device), x.dtype)
    cached = _state.weights.get(key)
    if cached is None:
        two_d = len(shape) == 2
        cached = _state.weights[key] = (
            fp.row_weights(name, shape[0]).to(x.device) if two_d else None,
            fp.col_weights(name, shape[-1]).to(x.device, x.dtype),  # exact in every float dtype
            fp.row_keys(name, shape[0]).to(x.device) if two_d else None,
            fp.col_keys(name, shape[-1] * per).to(x.device),
        )
    rows, cols, row_keys, col_keys = cached
    c0, c1 = region.cols
    prints = fp.fingerprint(x, region.row_weights(rows), region.col_weights(cols), with_abs=with_abs)
    return prints, fp.checksum(x, region.row_weights(row_keys), col_keys[c0 * per : c1 * per])


def _mapping_problems(export: _Export, owned: rule.Ownership, sync: int) -> list[Mismatch]:
    """HF tensors the actor exports that the engine has no place for, and engine tensors no export writes."""
    exported = set(mcore_mapping.hf_sources(export.hf_config))
    held = set(owned.partition)
    out = [
        Mismatch(_rank(), sync, "layout", n, "(none)", "the actor exports it, vLLM has no parameter for it")
        for n in sorted(exported - held)
    ]
    out += [
        Mismatch(_rank(), sync, "layout", n, "(vLLM)", "vLLM holds it, the actor's export never writes it")
        for n in sorted(held - exported)
    ]
    return out


# --- 3. after the sync: compare ----------------------------------------------------------------------------------


def verify(forward_context: Mapping[str, Any] | None = None, *, sync_s: float | None = None) -> SyncReport | None:
    """Compare this sync (module docstring, step 3) and agree with the other ranks; raises ``WeightSyncError`` on
    every rank when any rank found a mismatch. ``forward_context``: the engine's (for its MLA matrices). None when
    no checked sync is pending (a model the mapping does not cover)."""
    with _state.lock:
        export, record = _state.export, _state.received
        _state.export, _state.received = None, None
    if export is None and record is None:
        return None
    start = time.perf_counter()
    rank = _rank()
    if record is None:
        assert export is not None  # one of the two is pending (above)
        report = _not_received(export, rank)
    else:
        report = _compare(record, rank, rule.mla_context(forward_context or {}))
    report.sync_s = sync_s
    report.verify_s = time.perf_counter() - start
    for listener in list(CHECK_LISTENERS):
        try:
            listener(report)
        except Exception:
            logger.exception("weight check: a listener failed")
    _agree(report)
    return report


def _not_received(export: _Export, rank: int) -> SyncReport:
    detail = (
        "the actor exported its weights (per_tensor_generator) but none reached vLLM's load_weights: the engine "
        "keeps the weights of the sync before (or uninitialised memory after a release)"
    )
    names = sorted(mcore_mapping.hf_sources(export.hf_config))
    missing = Mismatch(rank, export.sync, "missing", ", ".join(names[:3]) + ", ...", "(every tensor)", detail)
    return SyncReport(export.sync, rank, 0, 0, [missing], 0.0, 0.0, 0.0)


def _compare(record: _Received, rank: int, context: Mapping[int, Any]) -> SyncReport:
    owned, sync = record.owned, record.sync
    mismatches = [Mismatch(rank, sync, m.kind, m.hf, m.engine, m.detail) for m in record.problems + record.shapes]
    found: dict[int, Print] = {}
    for index, slot in enumerate(owned.slots):
        if index not in record.load_prints:
            mismatches.append(_slot_not_received(record, slot, rank, context))
            continue
        try:
            tensor = slot.locate(context)
        except rule.MissingTensorError as error:
            mismatches.append(Mismatch(rank, sync, "load", slot.hf, slot.engine, str(error)))
            continue
        if tuple(tensor.shape) != slot.region.shape:
            detail = f"engine view {tuple(tensor.shape)}, the rule's region {slot.region.shape}"
            mismatches.append(Mismatch(rank, sync, "layout", slot.hf, slot.engine, detail))
            continue
        found[index] = region_print(tensor.detach(), slot.hf, owned.shapes[slot.hf], slot.region, with_abs=False)
    received = _host({i: record.load_prints[i] for i in found})
    engine = _host(found)
    for index in sorted(found):
        slot = owned.slots[index]
        diff = fp.compare(received[index][:3], engine[index][:3], received[index][3], slot.region.shape)
        if not diff.matches:
            mismatches.append(Mismatch(rank, sync, "load", slot.hf, slot.engine, diff.describe()))
    shares = 0
    if record.predicted is not None:
        prints = _host(record.export_prints)
        for hf in sorted(owned.partition):
            slot = owned.primary(hf)
            if slot is None or hf not in prints or (hf, 0) not in record.predicted:  # not exported: layout
                continue
            k = owned.partition[hf].index(slot.region)
            diff = fp.compare(record.predicted[(hf, k)], prints[hf][:3], prints[hf][3], slot.region.shape)
            shares += 1
            if not diff.matches:
                mismatches.append(
                    Mismatch(rank, sync, "export", hf, f"share {k} ({slot.region.describe()})", diff.describe())
                )
    twice = sorted(name for name, count in record.counts.items() if count > 1 and name in owned.partition)
    mismatches += [Mismatch(rank, sync, "layout", n, "(stream)", f"received {record.counts[n]} times") for n in twice]
    for prefix, module, expected in owned.expert_maps:
        mismatches += [
            Mismatch(rank, sync, "layout", prefix, "expert_map", p)
            for p in rule.expert_map_problems(prefix, module, expected)
        ]
    return SyncReport(sync, rank, len(found), shares, mismatches, record.predict_s, record.receive_s, 0.0)


def _slot_not_received(record: _Received, slot: rule.Slot, rank: int, context: Mapping[int, Any]) -> Mismatch:
    """A slot whose region never arrived: what the engine still holds there against what the actor holds (when
    predicted), so the message says how far apart they are."""
    detail = f"its region ({slot.region.describe()}) was never received in this sync"
    shape = record.owned.shapes[slot.hf]
    regions = record.owned.partition.get(slot.hf, [])
    k = regions.index(slot.region) if slot.region in regions else None
    if record.predicted is not None and slot.primary and (slot.hf, k) in record.predicted:
        try:
            held = _host({0: region_print(slot.locate(context).detach(), slot.hf, shape, slot.region, with_abs=True)})
        except rule.MissingTensorError:
            return Mismatch(rank, record.sync, "missing", slot.hf, slot.engine, detail)
        diff = fp.compare(record.predicted[(slot.hf, k)], held[0][:3], held[0][3], slot.region.shape)
        detail += f" (the actor's against what vLLM still holds: {diff.describe()})"
    return Mismatch(rank, record.sync, "missing", slot.hf, slot.engine, detail)


def _host(prints: Mapping[Any, Print]) -> dict[Any, tuple[float, float, int, float]]:
    """Fingerprints to host values in one transfer each: ``(proj, total, checksum, abs_total)``."""
    if not prints:
        return {}
    keys = list(prints)
    floats = torch.stack([prints[k][0] for k in keys]).to("cpu", torch.float64).tolist()
    checks = torch.stack([prints[k][1] for k in keys]).to("cpu").tolist()
    return {k: (f[0], f[1], int(c), f[2]) for k, f, c in zip(keys, floats, checks, strict=True)}


def _agree(report: SyncReport) -> None:
    """Every rank raises if any rank found a mismatch, naming the first ones of each such rank."""
    import torch.distributed as dist

    count = torch.tensor([len(report.mismatches)], dtype=torch.float64)
    _all_reduce(count)
    if count.item() == 0:
        logger.info(
            "weight check: sync %d on rank %d: %d engine tensors and %d received shares match (check %.3f s)",
            report.sync,
            report.rank,
            report.slots,
            report.shares,
            report.check_s,
        )
        return
    shown = [m.message() for m in report.mismatches[:SHOWN]]
    if len(report.mismatches) > SHOWN:
        shown.append(f"rank {report.rank}: ... {len(report.mismatches) - SHOWN} more")
    every: list[list[str]] = [shown]
    if dist.is_initialized() and dist.get_world_size() > 1:
        every = [[] for _ in range(dist.get_world_size())]
        dist.all_gather_object(every, shown, group=_group())
    lines = [line for rank_lines in every for line in rank_lines]
    msg = (
        f"weight sync {report.sync} is wrong on {sum(1 for r in every if r)} of {len(every)} ranks "
        f"({int(count.item())} mismatches); nothing was generated from it. First: " + "; ".join(lines) + ". A load "
        "mismatch is vLLM's loader or post-processing (weight_loader, expert map, MLA re-derivation, release / "
        "resume); an export mismatch is verl's per_tensor_generator or weight converter (TP / EP / PP gathers, "
        "names); 'not received' is a tensor the stream left out."
    )
    raise WeightSyncError(msg)


def _same_everywhere(value: int, what: str) -> None:
    """Refuse, on every rank, a collective whose size differs between ranks (it would hang or mix entries)."""
    bounds = torch.tensor([value, -value], dtype=torch.float64)
    _all_reduce(bounds, op="max")
    if bounds[0].item() != value or -bounds[1].item() != value:
        msg = (
            f"weight check: the ranks disagree on the {what} ({int(-bounds[1].item())} to {int(bounds[0].item())}); "
            "their vLLM models are laid out differently"
        )
        raise WeightSyncError(msg)


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_initialized() else 0


def _group() -> Any:
    """A process group that reduces CPU tensors: the world's when it has gloo, else a gloo group made once (every
    rank makes it at the same sync)."""
    import torch.distributed as dist

    if _state.group is None:
        backend = str(dist.get_backend())
        _state.group = dist.GroupMember.WORLD if "gloo" in backend else dist.new_group(backend="gloo")
    return _state.group


def _all_reduce(tensor: torch.Tensor, op: str = "sum") -> None:
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM, group=_group())
