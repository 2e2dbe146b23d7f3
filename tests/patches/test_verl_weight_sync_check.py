"""verl_weight_sync_check: the three wrappers on the real upstream targets, and the check's decisions (impl/
weight_check.py) on a sync whose engine and ownership are laid out by hand. The rule against vLLM's real DeepSeek-V3
class and the prediction from megatron-core's shards: tests/model/test_weight_sync_check.py and
tests/model/test_vllm_deepseek_load.py."""

from __future__ import annotations

import asyncio
import logging
import types
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from r1_ascend.patches import WeightSyncError, apply_one, installed_targets, patched_by, spec_by_name
from r1_ascend.patches import verl_weight_sync_check as patch
from r1_ascend.patches.impl import weight_check
from r1_ascend.patches.impl import weight_ownership as rule
from r1_ascend.weights.tiny import TINY_CONFIG, deepseek_v3_config

SPEC = spec_by_name(patch.NAME)
HF_CONFIG = {k: v for k, v in deepseek_v3_config(**TINY_CONFIG).items() if k != "quantization_config"}
Q_B = "model.layers.1.self_attn.q_b_proj.weight"
NORM = "model.layers.1.input_layernorm.weight"


@pytest.fixture(autouse=True)
def fresh_state() -> Iterator[None]:
    weight_check.reset()
    yield
    weight_check.reset()


def test_the_patch_wraps_verls_export_vllms_load_and_the_workers_sync() -> None:
    import verl.utils.megatron_utils as megatron_utils
    import verl.workers.megatron_workers as workers
    from vllm.model_executor.models import deepseek_v2

    apply_one(SPEC)
    assert set(installed_targets(patch.NAME)) == {target.path for target in SPEC.targets}
    assert patched_by(megatron_utils.per_tensor_generator) == patch.NAME
    assert workers.per_tensor_generator is megatron_utils.per_tensor_generator, "the worker's copy is rebound too"
    assert patched_by(deepseek_v2.DeepseekV2ForCausalLM.load_weights) == patch.NAME
    assert patched_by(workers.ActorRolloutRefWorker.rollout_mode) == patch.NAME


class _Config(dict):
    model_type = "deepseek_v3"

    def to_dict(self) -> dict[str, Any]:
        return dict(self)


def _engine(hf: dict[str, torch.Tensor]) -> tuple[rule.Ownership, dict[str, torch.Tensor]]:
    """An engine holding ``hf``'s tensors whole, one slot each; every HF tensor of the tiny config is shared whole
    (the rank holds the tensors given, other ranks the rest)."""
    from r1_ascend.patches.rules.mcore_mapping import hf_sources

    engine = {name: torch.zeros_like(t) for name, t in hf.items()}
    owned = rule.Ownership([], {}, {}, [])
    for name, source in hf_sources(HF_CONFIG).items():
        owned.share(name, source.shape, [rule.whole(source.shape)])
    for name, tensor in engine.items():
        owned.slots.append(
            rule.Slot(name, rule.whole(tuple(tensor.shape)), f"engine.{name}", lambda _c, t=tensor: t, tensor.dtype)
        )
    return owned, engine


def _tensors(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        Q_B: torch.randn(HF_CONFIG["num_attention_heads"] * 48, HF_CONFIG["q_lora_rank"], generator=g).bfloat16(),
        NORM: torch.randn(HF_CONFIG["hidden_size"], generator=g).bfloat16(),
    }


def _predicted(owned: rule.Ownership, actor: dict[str, torch.Tensor]) -> dict[tuple[str, int], tuple]:
    """What the actor's shards predict, computed here from whole tensors (the real prediction: the model tests)."""
    out = {}
    for name, regions in owned.partition.items():
        for k, region in enumerate(regions):
            if name in actor:
                prints, check = weight_check.region_print(
                    region.of(actor[name]), name, owned.shapes[name], region, with_abs=False
                )
                out[(name, k)] = (float(prints[0]), float(prints[1]), int(check))
            else:
                out[(name, k)] = (0.0, 0.0, 0)
    return out


def _sync(
    monkeypatch: pytest.MonkeyPatch,
    actor: dict[str, torch.Tensor],
    stream: list[tuple[str, torch.Tensor]],
    write: Any = None,
) -> weight_check.SyncReport | None:
    """One sync: the export begins, the stream goes through the check's receiving side into a fake vLLM loader
    that copies each tensor into the engine (or ``write(name, tensor, engine)``), then the check verifies."""
    owned, engine = _engine(actor)
    monkeypatch.setattr(rule, "ownership", lambda _model, _config: owned)
    monkeypatch.setattr(weight_check, "predict", lambda _export, _partition: _predicted(owned, actor))
    weight_check.begin_export([], _Config(HF_CONFIG))

    def load_weights(_model: Any, weights: Any) -> set[str]:
        for name, tensor in weights:
            if name in engine:
                (write or (lambda n, t, e: e[n].copy_(t)))(name, tensor, engine)
        return set(engine)

    model = types.SimpleNamespace(config=types.SimpleNamespace(**HF_CONFIG))
    weight_check.load(model, iter(stream), load_weights)
    return weight_check.verify({})


def test_a_healthy_sync_passes_and_reports_its_cost(monkeypatch: pytest.MonkeyPatch) -> None:
    actor = _tensors()
    seen: list[weight_check.SyncReport] = []
    monkeypatch.setattr(weight_check, "CHECK_LISTENERS", [seen.append])
    report = _sync(monkeypatch, actor, list(actor.items()))
    assert report is not None
    assert report.mismatches == []
    assert (report.slots, report.shares) == (2, 2)
    assert report.check_s >= report.verify_s > 0
    assert seen == [report]


def test_what_vllm_holds_differently_from_what_it_received_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """A loader that writes the tensor with its two row halves exchanged: a load mismatch naming the HF tensor,
    the engine tensor, the rank, the sync and both fingerprints."""
    actor = _tensors()

    def halves(name: str, tensor: torch.Tensor, engine: dict[str, torch.Tensor]) -> None:
        engine[name].copy_(torch.cat(tensor.chunk(2)[::-1]) if name == Q_B else tensor)

    with pytest.raises(WeightSyncError) as info:
        _sync(monkeypatch, actor, list(actor.items()), halves)
    message = str(info.value)
    assert f"rank 0, sync 1: {Q_B} -> engine.{Q_B}: vLLM holds other values than it received" in message
    assert "fingerprint expected proj" in message
    assert "found proj" in message
    assert NORM not in message


def test_a_stream_that_differs_from_the_actors_prediction_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stream carries a stale value of one tensor (what the actor's shards no longer hold): vLLM loads it
    faithfully, the export check names it."""
    actor = _tensors()
    stream = [(Q_B, actor[Q_B]), (NORM, _tensors(seed=1)[NORM])]
    with pytest.raises(
        WeightSyncError,
        match=rf"{NORM} -> share 0 .*the rollout received other values than the "
        "actor's own shards predict",
    ):
        _sync(monkeypatch, actor, stream)


def test_a_tensor_left_out_of_the_stream_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    actor = _tensors()
    with pytest.raises(WeightSyncError, match=rf"{NORM} -> engine.{NORM}: not received"):
        _sync(monkeypatch, actor, [(Q_B, actor[Q_B])])


def test_a_tensor_sent_twice_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    actor = _tensors()
    with pytest.raises(WeightSyncError, match=rf"{NORM} -> \(stream\): .*received 2 times"):
        _sync(monkeypatch, actor, [*actor.items(), (NORM, actor[NORM])])


def test_a_sync_that_never_reaches_vllm_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """The export began (per_tensor_generator) and nothing reached vLLM's load_weights: the engine keeps the sync
    before's weights; every rank stops, the listener still hears of it."""
    seen: list[weight_check.SyncReport] = []
    monkeypatch.setattr(weight_check, "CHECK_LISTENERS", [seen.append])
    weight_check.begin_export([], _Config(HF_CONFIG))
    with pytest.raises(WeightSyncError, match=r"sync 1: .*lm_head.weight.*none reached vLLM's load_weights"):
        weight_check.verify({})
    assert [len(r.mismatches) for r in seen] == [1]
    assert weight_check.verify({}) is None, "consumed: the next sync starts afresh"


def test_a_model_the_mapping_does_not_cover_is_logged_and_not_checked(caplog: pytest.LogCaptureFixture) -> None:
    config = types.SimpleNamespace(model_type="qwen2")
    with caplog.at_level(logging.WARNING):
        weight_check.begin_export([], config)
        weight_check.begin_export([], config)
    assert weight_check.verify({}) is None
    assert [r.message for r in caplog.records].count(caplog.records[0].message) == 1
    assert "'qwen2'" in caplog.records[0].message
    assert "not checked" in caplog.records[0].message


def test_the_export_wrapper_registers_the_sync_and_streams_verls_generator(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def per_tensor_generator(
        actor_module,
        model_config,
        weight_converter,
        transformer_config,
        layer_name_mapping,
        convert_qkv_gate_up_by_simple_split=True,
    ):
        calls.append(convert_qkv_gate_up_by_simple_split)
        yield from [("a", 1), ("b", 2)]

    wrapped = patch._build_export(per_tensor_generator)
    stream = wrapped(["chunk"], _Config(HF_CONFIG), None, None, {})
    assert weight_check._state.export is not None
    assert weight_check._state.export.actor_module == ["chunk"]
    assert calls == [], "nothing exported before the rollout reads the stream"
    assert list(stream) == [("a", 1), ("b", 2)]
    assert calls == [True]


def test_the_sync_is_verified_after_verls_rollout_mode_with_the_engines_forward_context(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    order = []
    context = {"model.layers.0.self_attn.attn": object()}

    async def rollout_mode(self: Any) -> str:
        order.append("sync")
        return "done"

    monkeypatch.setattr(patch, "forward_context", lambda rollout: context if rollout == "rollout" else None)
    monkeypatch.setattr(weight_check, "verify", lambda ctx, sync_s: order.append(("verify", ctx, sync_s >= 0)))
    worker = types.SimpleNamespace(rollout="rollout")
    assert asyncio.run(patch._build_rollout_mode(rollout_mode)(worker)) == "done"
    assert order == ["sync", ("verify", context, True)]


def test_vllms_load_goes_through_the_checks_receiving_side(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []
    monkeypatch.setattr(weight_check, "load", lambda model, weights, original: seen.append((model, weights)) or 5)
    assert patch._build_load_weights(lambda self, weights: None)("model", "weights") == 5
    assert seen == [("model", "weights")]
