"""vllm_rollout_offload: verl selects our rollout, which frees and restores weights and KV cache without sleep mode.

The registry patch runs against verl 0.6.1's real ``_ROLLOUT_REGISTRY``/``get_rollout_class``; the rollout runs its
real ``__init__`` (stock verl ``vLLMRollout.__init__`` included, with ``LLM`` replaced by a recording fake) and its
release/resume/update_weights against the CPU engine stand-ins of ``rollout_fakes`` (see that module for the paths).
Memory is accounted from tensor storage sizes, independently of the rollout's own bookkeeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from r1_ascend.patches import PatchTargetError, Target, apply_one, spec_by_name

sys.path.insert(0, str(Path(__file__).parent))
import rollout_fakes as fakes

SPEC = spec_by_name("vllm_rollout_offload")
KV_SPEC = spec_by_name("vllm_engine_kv_cache_configs")


@pytest.fixture
def rollout_module() -> types.ModuleType:
    from r1_ascend.patches.impl import rollout_vllm

    return rollout_vllm


@pytest.fixture
def llm() -> fakes.FakeLLM:
    apply_one(KV_SPEC)
    return fakes.FakeLLM()


@pytest.fixture
def rollout(rollout_module: types.ModuleType, llm: fakes.FakeLLM) -> Any:
    """The rollout wired to the fake engine, as its ``__init__`` leaves it after building ``LLM``."""
    instance = object.__new__(rollout_module.NPUOffloadVLLMRollout)
    instance.inference_engine = llm
    instance._init_memory_state(rollout_module.EngineParts.locate(llm))
    return instance


def run(coro: Any) -> Any:
    return asyncio.run(coro)


# --- registry patch -------------------------------------------------------------------------------------------


def test_applies_to_pinned_verl_and_get_rollout_class_returns_ours(rollout_module: types.ModuleType) -> None:
    from verl.workers.rollout import base
    from verl.workers.rollout.vllm_rollout.vllm_rollout_spmd import vLLMRollout

    stock = base._ROLLOUT_REGISTRY[("vllm", "sync")]
    apply_one(SPEC)
    assert base._ROLLOUT_REGISTRY[("vllm", "sync")] == "r1_ascend.patches.impl.rollout_vllm.NPUOffloadVLLMRollout"
    selected = base.get_rollout_class("vllm", "sync")
    assert selected is rollout_module.NPUOffloadVLLMRollout
    assert issubclass(selected, vLLMRollout)
    assert base._ROLLOUT_REGISTRY[("vllm", "async")].endswith("vLLMAsyncRollout")
    from r1_ascend.patches import restore_all

    restore_all()
    assert base._ROLLOUT_REGISTRY[("vllm", "sync")] == stock


def _fake_base(monkeypatch: pytest.MonkeyPatch, registry: dict[Any, str]) -> Any:
    module = types.ModuleType("r1_fake_rollout_base")
    module._ROLLOUT_REGISTRY = registry
    monkeypatch.setitem(sys.modules, module.__name__, module)
    target = Target(module.__name__, "_ROLLOUT_REGISTRY", "verl", key=("vllm", "sync"))
    return dataclasses.replace(SPEC, targets=(target,))


def test_registry_without_the_sync_key_is_a_target_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """verl >= fd893c78 (#4411) removed ("vllm", "sync"): the patch must refuse instead of adding the key."""
    from r1_ascend.patches import vllm_rollout_offload

    registry = {("vllm", "async"): "verl.workers.rollout.vllm_rollout.vLLMAsyncRollout"}
    spec = _fake_base(monkeypatch, registry)
    with pytest.raises(PatchTargetError, match=r"\('vllm', 'sync'\).*R1_ASCEND_DISABLE=vllm_rollout_offload"):
        vllm_rollout_offload.apply(spec)
    assert ("vllm", "sync") not in registry


def test_registry_entry_replaced_by_someone_else_is_a_target_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from r1_ascend.patches import vllm_rollout_offload

    registry = {("vllm", "sync"): "somewhere.else.Rollout"}
    spec = _fake_base(monkeypatch, registry)
    with pytest.raises(PatchTargetError, match=r"somewhere\.else\.Rollout"):
        vllm_rollout_offload.apply(spec)
    assert registry[("vllm", "sync")] == "somewhere.else.Rollout"


# --- __init__: real stock constructor, engine built with sleep mode off ------------------------------------------


@pytest.fixture
def process_group(tmp_path: Path) -> Iterator[None]:
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    yield
    torch.distributed.destroy_process_group()


def _rollout_config(**overrides: Any) -> Any:
    from verl.workers.config import RolloutConfig

    values = dict(
        name="vllm",
        tensor_model_parallel_size=1,
        prompt_length=1024,
        response_length=3072,
        max_num_batched_tokens=1024,
        enable_chunked_prefill=True,
        free_cache_engine=True,
        load_format="dummy",
    )
    values.update(overrides)
    return RolloutConfig(**values)


def _model_config() -> Any:
    hf_config = types.SimpleNamespace(max_position_embeddings=163840, rope_scaling=None)
    return types.SimpleNamespace(
        local_path="/models/deepseek-v3",
        tokenizer=types.SimpleNamespace(pad_token_id=1),
        hf_config=hf_config,
        trust_remote_code=True,
        lora_rank=0,
        lora_adapter_path=None,
    )


@pytest.fixture
def built_llms(monkeypatch: pytest.MonkeyPatch, llm: fakes.FakeLLM) -> list[dict[str, Any]]:
    """Replace ``LLM`` where stock verl calls it; record its keyword arguments and hand back the fake engine."""
    from verl.workers.rollout.vllm_rollout import vllm_rollout_spmd

    calls: list[dict[str, Any]] = []

    def build_llm(**kwargs: Any) -> fakes.FakeLLM:
        calls.append(kwargs)
        return llm

    monkeypatch.setattr(vllm_rollout_spmd, "LLM", build_llm)
    return calls


@pytest.mark.usefixtures("process_group")
def test_init_builds_engine_with_sleep_mode_off_through_stock_init(
    rollout_module: types.ModuleType, built_llms: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    from verl.workers.rollout.vllm_rollout.vllm_rollout_spmd import vLLMRollout

    stock_init = vLLMRollout.__init__
    seen: list[Any] = []

    def dp_ep_wrapper(self: Any, config: Any, model_config: Any, device_mesh: Any) -> None:
        seen.append(config)  # stands in for vllm_dp_ep_groups, which wraps the stock __init__
        stock_init(self, config, model_config, device_mesh)

    monkeypatch.setattr(vLLMRollout, "__init__", dp_ep_wrapper)
    config = _rollout_config()
    rollout = rollout_module.NPUOffloadVLLMRollout(config, _model_config(), None)

    assert len(seen) == 1, "the stock __init__ (and anything wrapping it) must run exactly once"
    (kwargs,) = built_llms
    assert kwargs["enable_sleep_mode"] is False
    assert kwargs["distributed_executor_backend"] == "external_launcher"
    assert kwargs["max_num_batched_tokens"] == 1024
    assert kwargs["max_model_len"] == 4096
    assert rollout.config.free_cache_engine is True, "verl's worker calls resume/release only when this is True"
    assert rollout.config is config
    assert rollout.weights_resident
    assert rollout.kv_cache_resident


@pytest.mark.usefixtures("process_group", "built_llms")
def test_init_refuses_free_cache_engine_false(rollout_module: types.ModuleType) -> None:
    from r1_ascend.patches.rules.rollout_config import RolloutConfigError

    with pytest.raises(RolloutConfigError, match="free_cache_engine=True"):
        rollout_module.NPUOffloadVLLMRollout(_rollout_config(free_cache_engine=False), _model_config(), None)


@pytest.mark.usefixtures("process_group")
def test_init_rejects_small_batches_under_ascend_scheduler_without_chunked_prefill(
    rollout_module: types.ModuleType, built_llms: list[dict[str, Any]]
) -> None:
    from r1_ascend.patches.rules.rollout_config import RolloutConfigError

    ascend = {"vllm": {"additional_config": {"ascend_scheduler_config": {"enabled": True}}}}
    with pytest.raises(RolloutConfigError, match=r"max_num_batched_tokens>=4096"):
        rollout_module.NPUOffloadVLLMRollout(_rollout_config(engine_kwargs=ascend), _model_config(), None)
    assert built_llms == [], "the check must run before the engine is built"


@settings(max_examples=60, deadline=None)
@given(
    batched=st.integers(1, 9000),
    length=st.integers(1, 9000),
    enabled=st.booleans(),
    chunked=st.sampled_from([None, False, True]),
)
def test_batched_token_check_agrees_with_vllm_ascend_scheduler(
    batched: int, length: int, enabled: bool, chunked: bool | None
) -> None:
    """Our check raises exactly when vllm-ascend 0.9.1 would reject the scheduler config (V1: chunked prefill on)."""
    from vllm.config import SchedulerConfig
    from vllm_ascend.ascend_config import AscendSchedulerConfig as AscendOptions
    from vllm_ascend.core.schedule_config import AscendSchedulerConfig

    from r1_ascend.patches.rules.rollout_config import RolloutConfigError, check_batched_tokens

    options: dict[str, Any] = {"enabled": enabled}
    if chunked is not None:
        options["enable_chunked_prefill"] = chunked
    engine_kwargs = {"vllm": {"additional_config": {"ascend_scheduler_config": options}}}
    config = types.SimpleNamespace(
        max_num_batched_tokens=batched,
        max_model_len=length,
        prompt_length=0,
        response_length=0,
        engine_kwargs=engine_kwargs,
    )
    vllm_rejects = False
    base = SchedulerConfig(
        runner_type="generate",
        max_num_batched_tokens=batched,
        max_num_seqs=1,
        max_model_len=length,
        enable_chunked_prefill=True,
    )
    if enabled:
        try:
            AscendSchedulerConfig.initialize_from_config(base, AscendOptions(options))
        except ValueError:
            vllm_rejects = True
    try:
        check_batched_tokens(config)
        ours_rejects = False
    except RolloutConfigError:
        ours_rejects = True
    assert ours_rejects == vllm_rejects


# --- release / resume ---------------------------------------------------------------------------------------------


def _sizes(llm: fakes.FakeLLM) -> dict[str, int]:
    return {
        "weights": fakes.parameter_storage_bytes(llm.model),
        "kv_cache": fakes.kv_cache_bytes(llm.runner),
        "mla": fakes.mla_matrix_bytes(llm.runner),
    }


def test_release_frees_weights_kv_cache_and_mla_matrices(rollout: Any, llm: fakes.FakeLLM) -> None:
    before = _sizes(llm)
    assert all(before.values()), before
    params_before = {name: (p.shape, p.dtype) for name, p in llm.model.named_parameters()}

    run(rollout.release())

    assert _sizes(llm) == {"weights": 0, "kv_cache": 0, "mla": 0}
    assert llm.runner.kv_caches == []
    assert {name: (p.shape, p.dtype) for name, p in llm.model.named_parameters()} == params_before
    assert llm.prefix_cache_resets == 1
    run(rollout.release())  # idempotent
    assert _sizes(llm) == {"weights": 0, "kv_cache": 0, "mla": 0}


@pytest.mark.parametrize(
    ("tags", "restored"),
    [
        (["weights"], {"weights"}),
        (["weights", "kv_cache"], {"weights", "kv_cache"}),
        (["kv_cache", "weights"], {"weights", "kv_cache"}),
    ],
)
def test_resume_restores_exactly_the_tagged_memory(
    rollout: Any, llm: fakes.FakeLLM, tags: list[str], restored: set[str]
) -> None:
    before = _sizes(llm)
    run(rollout.release())
    run(rollout.resume(tags))
    after = _sizes(llm)
    for part in ("weights", "kv_cache"):
        assert after[part] == (before[part] if part in restored else 0), (part, after)
    assert after["mla"] == 0, "MLA matrices come back only with update_weights"
    assert rollout.weights_resident == ("weights" in restored)
    assert rollout.kv_cache_resident == ("kv_cache" in restored)


def test_resume_kv_cache_alone_after_weights(rollout: Any, llm: fakes.FakeLLM) -> None:
    """verl's order: resume(["weights"]), update_weights, resume(["kv_cache"]); the KV tag restores only the cache."""
    before = _sizes(llm)
    run(rollout.release())
    run(rollout.resume(["weights"]))
    weights_only = _sizes(llm)
    run(rollout.resume(["kv_cache"]))
    after = _sizes(llm)
    assert weights_only["kv_cache"] == 0
    assert after["kv_cache"] == before["kv_cache"]
    assert after["weights"] == weights_only["weights"] == before["weights"]


def test_resume_kv_cache_while_weights_released_is_refused(rollout: Any, rollout_module: types.ModuleType) -> None:
    run(rollout.release())
    with pytest.raises(rollout_module.RolloutMemoryError, match=r"resume\(\['weights'\]\) first"):
        run(rollout.resume(["kv_cache"]))


@pytest.mark.parametrize("tags", [["weight"], ["weights", "kv"], "weights"])
def test_resume_rejects_unknown_tags(rollout: Any, tags: Any) -> None:
    with pytest.raises(ValueError, match="expected a list drawn from"):
        run(rollout.resume(tags))


def test_kv_cache_rebuilt_with_the_saved_configs(rollout: Any, llm: fakes.FakeLLM) -> None:
    from r1_ascend.patches.vllm_engine_kv_cache_configs import saved_kv_cache_configs

    saved = saved_kv_cache_configs(llm.engine_core)
    startup_shapes = [tuple(t.shape) for pair in llm.runner.kv_caches for t in pair]
    warmups = llm.executor.warmups
    run(rollout.release())
    run(rollout.resume(["weights", "kv_cache"]))

    name, passed = llm.executor.calls[-1]
    assert name == "initialize_from_config"
    assert passed is saved, "caches must be rebuilt from the very configs the scheduler was sized from"
    assert llm.runner.received_configs[-1] is saved[0]
    assert [tuple(t.shape) for pair in llm.runner.kv_caches for t in pair] == startup_shapes
    assert not any(call == "determine_available_memory" for call, _ in llm.executor.calls[2:]), "no re-profiling"
    assert llm.executor.warmups == warmups + 1
    assert llm.prefix_cache_resets == 2  # once on release, once after the rebuild


def test_non_mla_impl_forgets_its_cached_kv_tensors(rollout: Any, llm: fakes.FakeLLM) -> None:
    """AscendAttentionBackendImpl caches key/value tensors on first use and never refreshes them."""
    impl = llm.runner.forward_context[fakes.layer_name(0)].impl
    impl.key_cache, impl.value_cache = llm.runner.kv_caches[0]
    run(rollout.release())
    assert impl.key_cache is None
    assert impl.value_cache is None


# --- weight sync --------------------------------------------------------------------------------------------------


def _expected_mla(kv_b_weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """W_UV (N, L, V) and W_UK_T (N, P, L) computed here from kv_b_proj (out = N * (P + V), in = L)."""
    per_head = kv_b_weight.view(fakes.NUM_HEADS, fakes.QK_NOPE_HEAD_DIM + fakes.V_HEAD_DIM, fakes.KV_LORA_RANK)
    w_uk, w_uv = per_head[:, : fakes.QK_NOPE_HEAD_DIM], per_head[:, fakes.QK_NOPE_HEAD_DIM :]
    return w_uv.transpose(1, 2), w_uk


def test_update_weights_refills_parameters_and_recomputes_mla(rollout: Any, llm: fakes.FakeLLM) -> None:
    run(rollout.release())
    run(rollout.resume(["weights"]))
    new = fakes.fresh_weights(llm.model)
    run(rollout.update_weights(fakes.stream(new)))
    run(rollout.resume(["kv_cache"]))

    for name, param in llm.model.named_parameters():
        torch.testing.assert_close(param, new[name])
    for index in range(fakes.NUM_LAYERS):
        impl = llm.runner.forward_context[fakes.layer_name(index)].impl
        assert impl.calls == [fakes.DTYPE], "MLA post-processing must run once per weight load, with the model dtype"
        w_uv, w_uk_t = _expected_mla(new[f"model.layers.{index}.self_attn.kv_b_proj.weight"])
        torch.testing.assert_close(impl.W_UV, w_uv)
        torch.testing.assert_close(impl.W_UK_T, w_uk_t)
    rollout.verify_weights_loaded()


def test_fake_mla_impl_has_the_upstream_post_load_signature() -> None:
    from vllm_ascend.attention.mla_v1 import AscendMLAImpl

    upstream = inspect.signature(AscendMLAImpl.process_weights_after_loading)
    ours = inspect.signature(fakes.RecordingMLAImpl.process_weights_after_loading)
    assert [(p.name, p.kind) for p in ours.parameters.values()] == [
        (p.name, p.kind) for p in upstream.parameters.values()
    ]
    upstream.bind(object(), torch.bfloat16)  # how the rollout calls it: one positional dtype


def test_missed_parameter_is_reported_before_generation(
    rollout: Any, llm: fakes.FakeLLM, rollout_module: types.ModuleType
) -> None:
    missed = "model.layers.1.mlp.weight"
    run(rollout.release())
    run(rollout.resume(["weights"]))
    run(rollout.update_weights(fakes.stream(fakes.fresh_weights(llm.model, skip=[missed]))))
    with pytest.raises(rollout_module.WeightSyncError, match=rf"1 of \d+ rollout parameters.*{missed}"):
        rollout.verify_weights_loaded()
    with pytest.raises(rollout_module.WeightSyncError):
        rollout.generate_sequences(None)


def test_weights_streamed_in_several_calls_count_together(rollout: Any, llm: fakes.FakeLLM) -> None:
    new = fakes.fresh_weights(llm.model)
    names = sorted(new)
    run(rollout.release())
    run(rollout.resume(["weights"]))
    run(rollout.update_weights(fakes.stream({n: new[n] for n in names[::2]})))
    run(rollout.update_weights(fakes.stream({n: new[n] for n in names[1::2]})))
    rollout.verify_weights_loaded()


def test_update_weights_while_released_is_refused(rollout: Any, llm: fakes.FakeLLM, rollout_module: Any) -> None:
    run(rollout.release())
    with pytest.raises(rollout_module.RolloutMemoryError, match="resume"):
        run(rollout.update_weights(fakes.stream(fakes.fresh_weights(llm.model))))
    assert llm.model.load_calls == 0


def test_generation_while_released_is_refused(rollout: Any, rollout_module: types.ModuleType) -> None:
    run(rollout.release())
    with pytest.raises(rollout_module.RolloutMemoryError, match="resume"):
        rollout.generate_sequences(None)


def test_two_training_steps_round_trip(rollout: Any, llm: fakes.FakeLLM) -> None:
    """verl 0.6.1 worker order, twice: trainer_mode -> rollout_mode -> trainer_mode -> rollout_mode."""
    before = _sizes(llm)
    for _ in range(2):
        run(rollout.release())
        run(rollout.resume(["weights"]))
        run(rollout.update_weights(fakes.stream(fakes.fresh_weights(llm.model))))
        run(rollout.resume(["kv_cache"]))
        rollout.verify_weights_loaded()
        assert _sizes(llm) == before


def _engine_config(**vllm_kwargs: object) -> types.SimpleNamespace:
    return types.SimpleNamespace(
        enforce_eager=False, max_num_seqs=64, tensor_model_parallel_size=2, engine_kwargs={"vllm": vllm_kwargs}
    )


def test_rollout_refuses_engine_options_vllm_ascend_rejects() -> None:
    """The rollout class re-checks the engine options on the cluster, before LLM() fails deep inside."""
    from r1_ascend.patches.impl.rollout_vllm import check_engine_options_for
    from r1_ascend.patches.rules.rollout_config import RolloutConfigError

    deepseek = types.SimpleNamespace(hf_config=types.SimpleNamespace(model_type="deepseek_v3", n_routed_experts=256))
    with pytest.raises(RolloutConfigError, match="ACL Graph does not support deepseek"):
        check_engine_options_for(_engine_config(), deepseek)
    good = _engine_config(
        enable_expert_parallel=True,
        additional_config={"refresh": True, "torchair_graph_config": {"enabled": True, "graph_batch_sizes": [64]}},
    )
    with pytest.raises(RolloutConfigError, match="frozen parameters"):
        check_engine_options_for(good, deepseek)  # TorchAir without vllm_ascend_torchair_live_params in this process
    apply_one(spec_by_name("vllm_ascend_torchair_live_params"))
    check_engine_options_for(good, deepseek)  # world size 1 here: DP 1, nothing else required
    qwen = types.SimpleNamespace(hf_config=types.SimpleNamespace(model_type="qwen2"))
    with pytest.raises(RolloutConfigError, match="only supported for DeepSeek"):
        check_engine_options_for(good, qwen)


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"additional_config": {"refresh": True}}, "enable_expert_parallel is not true"),
        ({"enable_expert_parallel": True}, "refresh is not true"),
    ],
)
def test_data_parallel_rollout_needs_expert_parallel_and_refresh(kwargs: dict, expected: str) -> None:
    from r1_ascend.patches.rules.rollout_config import check_engine_options

    config = _engine_config(**kwargs)
    config.enforce_eager = True  # graph mode is checked separately
    problems = check_engine_options(config, model_type="deepseek_v3", is_moe=True, dp_size=128)
    assert any(expected in p for p in problems), problems
    assert check_engine_options(config, model_type="deepseek_v3", is_moe=True, dp_size=1) == []
    # with vllm_dp_ep_groups disabled each TP group runs its own engine: neither requirement applies
    assert check_engine_options(config, model_type="deepseek_v3", is_moe=True, dp_size=128, dp_groups=False) == []


# --- RNG state across the KV-cache rebuild --------------------------------------------------------------------


class DeviceRng:
    """Stands in for ``torch.npu``'s generator API (get/set_rng_state, manual_seed) with a CPU generator."""

    def __init__(self) -> None:
        self.generator = torch.Generator().manual_seed(1234)

    def get_rng_state(self) -> torch.Tensor:
        return self.generator.get_state()

    def set_rng_state(self, state: torch.Tensor) -> None:
        self.generator.set_state(state)

    def manual_seed(self, seed: int) -> None:
        self.generator.manual_seed(seed)


def _draws(device: DeviceRng) -> tuple[Any, ...]:
    import random

    import numpy as np

    return (
        random.random(),
        float(np.random.rand()),
        float(torch.rand(1)),
        float(torch.rand(1, generator=device.generator)),
    )


@pytest.mark.parametrize("preserve", [True, False])
def test_kv_cache_rebuild_keeps_the_training_rng_state(
    rollout: Any, llm: fakes.FakeLLM, rollout_module: types.ModuleType, monkeypatch: pytest.MonkeyPatch, preserve: bool
) -> None:
    """The rebuild runs vLLM's real ``set_random_seed`` (as ``compile_or_warm_up_model`` does); the state survives."""
    from vllm.model_executor import set_random_seed

    device = DeviceRng()
    monkeypatch.setattr(rollout_module, "accelerator_module", lambda: device)
    if not preserve:  # the check below must fail without the fix
        monkeypatch.setattr(rollout_module, "preserved_rng_state", lambda _module: contextlib.nullcontext())
    rebuild = llm.executor.initialize_from_config

    def initialize_then_reseed(configs: list[Any]) -> None:
        rebuild(configs)
        set_random_seed(0)  # what compile_or_warm_up_model ends with; torch.manual_seed also reseeds devices
        device.manual_seed(0)

    monkeypatch.setattr(llm.executor, "initialize_from_config", initialize_then_reseed)
    run(rollout.release())
    run(rollout.resume(["weights"]))
    run(rollout.update_weights(fakes.stream(fakes.fresh_weights(llm.model))))
    set_random_seed(7)
    device.manual_seed(7)
    expected = _draws(device)
    set_random_seed(7)
    device.manual_seed(7)
    run(rollout.resume(["kv_cache"]))
    assert (_draws(device) == expected) is preserve
