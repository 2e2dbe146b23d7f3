"""vllm_engine_kv_cache_configs: the real ``EngineCore._initialize_kv_caches`` keeps the configs it initialised with.

The method runs bound to a minimal engine object whose executor has the calls vLLM 0.9.1 makes
(``get_kv_cache_specs``, ``determine_available_memory``, ``initialize_from_config``); KV-cache specs and configs are
vLLM's real classes and the config computation is vLLM's own (``get_kv_cache_config``, ``unify_kv_cache_configs``,
the latter through the patch's wrapper).
"""

from __future__ import annotations

import dataclasses
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from r1_ascend.patches import PatchTargetError, Target, apply_one, get_original, patched_by, spec_by_name
from r1_ascend.patches.vllm_engine_kv_cache_configs import (
    KV_CACHE_CONFIGS_ATTR,
    KVCacheConfigError,
    build,
    build_unify,
    check_block_counts,
    saved_kv_cache_configs,
)

sys.path.insert(0, str(Path(__file__).parent))
import rollout_fakes as fakes

SPEC = spec_by_name("vllm_engine_kv_cache_configs")


class MultiWorkerExecutor(fakes.FakeExecutor):
    """An executor with several workers whose free memory differs (as ranks' memory can)."""

    def __init__(self, runner: fakes.FakeModelRunner, memories: list[int]) -> None:
        super().__init__(runner, memories[0])
        self.memories = memories

    def get_kv_cache_specs(self) -> list[dict[str, Any]]:
        return [self.model_runner.get_kv_cache_spec() for _ in self.memories]

    def determine_available_memory(self) -> list[int]:
        return list(self.memories)

    def initialize_from_config(self, kv_cache_configs: list[Any]) -> None:
        self.calls.append(("initialize_from_config", kv_cache_configs))


def _engine(executor: Any) -> Any:
    return types.SimpleNamespace(model_executor=executor)


def test_applies_to_pinned_vllm_and_is_marked() -> None:
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.engine import core
    from vllm.v1.engine.core import EngineCore

    stock = EngineCore._initialize_kv_caches
    apply_one(SPEC)
    assert patched_by(EngineCore._initialize_kv_caches) == SPEC.name
    assert patched_by(core.unify_kv_cache_configs) == SPEC.name
    assert kv_cache_utils.unify_kv_cache_configs is get_original(SPEC.target("unify_kv_cache_configs"))
    assert get_original(SPEC.target("EngineCore._initialize_kv_caches")) is stock
    assert apply_one(SPEC).value == "already applied"
    from r1_ascend.patches import restore_all

    restore_all()
    assert EngineCore._initialize_kv_caches is stock
    assert core.unify_kv_cache_configs is kv_cache_utils.unify_kv_cache_configs


def test_real_method_stores_the_configs_it_passed_to_the_executor() -> None:
    from vllm.v1.engine.core import EngineCore

    apply_one(SPEC)
    runner = fakes.FakeModelRunner(fakes.FakeForCausalLM())
    executor = fakes.FakeExecutor(runner, available_memory=48 * 1024)
    engine = _engine(executor)

    num_gpu_blocks, num_cpu_blocks, scheduler_config = EngineCore._initialize_kv_caches(engine, fakes.vllm_config())

    (passed,) = [arg for name, arg in executor.calls if name == "initialize_from_config"]
    stored = getattr(engine, KV_CACHE_CONFIGS_ATTR)
    assert saved_kv_cache_configs(engine) is stored
    assert len(stored) == len(passed) == 1
    assert all(s is p for s, p in zip(stored, passed, strict=True))
    assert scheduler_config is stored[0]
    assert num_gpu_blocks == stored[0].num_blocks > 0
    assert num_cpu_blocks == 0
    assert runner.received_configs == [stored[0]], "the worker still received the configs"
    assert "initialize_from_config" not in vars(executor), "the executor itself is never touched"


def test_every_worker_config_is_kept_and_agrees_on_blocks() -> None:
    from vllm.v1.engine.core import EngineCore

    apply_one(SPEC)
    runner = fakes.FakeModelRunner(fakes.FakeForCausalLM())
    executor = MultiWorkerExecutor(runner, [48 * 1024, 40 * 1024, 64 * 1024])
    engine = _engine(executor)
    EngineCore._initialize_kv_caches(engine, fakes.vllm_config())

    stored = saved_kv_cache_configs(engine)
    assert len(stored) == 3
    assert len({config.num_blocks for config in stored}) == 1
    page = next(iter(runner.get_kv_cache_spec().values())).page_size_bytes
    assert stored[0].num_blocks == 40 * 1024 // page // fakes.NUM_LAYERS, "vLLM unifies to the smallest worker"


def test_nothing_is_stored_when_the_executor_fails() -> None:
    from vllm.v1.engine.core import EngineCore

    from r1_ascend.patches import vllm_engine_kv_cache_configs as patch

    class Failing(fakes.FakeExecutor):
        def initialize_from_config(self, kv_cache_configs: list[Any]) -> None:
            raise MemoryError("out of device memory")

    apply_one(SPEC)
    executor = Failing(fakes.FakeModelRunner(fakes.FakeForCausalLM()), 48 * 1024)
    engine = _engine(executor)
    with pytest.raises(MemoryError):
        EngineCore._initialize_kv_caches(engine, fakes.vllm_config())
    assert not hasattr(engine, KV_CACHE_CONFIGS_ATTR)
    assert patch._capture.get() is None, "the capture is closed even when the original raises"


def _config(num_blocks: int) -> Any:
    return types.SimpleNamespace(num_blocks=num_blocks)


def test_disagreeing_block_counts_raise_before_reaching_the_workers() -> None:
    """An upstream that stops unifying block counts must not get past the wrapper."""
    received: list[Any] = []

    def drifted_initialize(self: Any, vllm_config: Any) -> Any:
        configs = [_config(2111), _config(2055)]
        build_unify(lambda kv_cache_configs: None)(configs)  # a unify that no longer unifies
        received.append(configs)  # what would reach the workers
        return 2111, 0, configs[0]

    with pytest.raises(KVCacheConfigError, match=r"\[2111, 2055\]"):
        build(drifted_initialize)(_engine(types.SimpleNamespace()), None)
    assert received == []


def test_unify_wrapper_only_records_inside_initialize() -> None:
    """Outside the engine's KV-cache initialisation the unify wrapper forwards and records nothing."""
    seen: list[Any] = []
    configs = [_config(7), _config(8)]
    build_unify(seen.append)(configs)  # no capture open: no check, no recording
    assert seen == [configs]


def test_check_block_counts() -> None:
    assert check_block_counts([_config(7), _config(7)]) == 7
    with pytest.raises(KVCacheConfigError, match="disagree"):
        check_block_counts([_config(7), _config(8)])
    with pytest.raises(KVCacheConfigError, match="empty"):
        check_block_counts([])


def test_upstream_that_skips_the_unify_call_is_reported() -> None:
    executor = fakes.FakeExecutor(fakes.FakeModelRunner(fakes.FakeForCausalLM()), 48 * 1024)
    with pytest.raises(KVCacheConfigError, match=r"without calling unify_kv_cache_configs"):
        build(lambda self, vllm_config: (1, 0, None))(_engine(executor), None)


def test_scheduler_config_from_another_list_is_reported() -> None:
    """If the scheduler is sized from a config that is not the recorded list's first, the recording is wrong."""

    def drifted_initialize(self: Any, vllm_config: Any) -> Any:
        configs = [_config(5)]
        build_unify(lambda kv_cache_configs: None)(configs)
        return 5, 0, _config(5)

    with pytest.raises(KVCacheConfigError, match="not the first of the list"):
        build(drifted_initialize)(_engine(types.SimpleNamespace()), None)


def test_missing_configs_name_the_patch_and_the_switch() -> None:
    with pytest.raises(KVCacheConfigError, match=r"vllm_engine_kv_cache_configs.*R1_ASCEND_DISABLE"):
        saved_kv_cache_configs(types.SimpleNamespace())


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("def _initialize_kv_cache(self, vllm_config):\n    pass\n", "not found"),
        ("def _initialize_kv_caches(self, vllm_config, extra):\n    pass\n", "drifted"),
    ],
)
def test_drifted_engine_core_is_a_target_error(monkeypatch: pytest.MonkeyPatch, body: str, expected: str) -> None:
    module = types.ModuleType("r1_fake_vllm_core")
    namespace: dict[str, Any] = {}
    exec(body, namespace)  # one method, renamed or with a changed signature
    method = next(v for k, v in namespace.items() if k.startswith("_initialize"))
    module.EngineCore = type("EngineCore", (), {method.__name__: method})
    module.unify_kv_cache_configs = lambda kv_cache_configs: None  # unchanged
    monkeypatch.setitem(sys.modules, module.__name__, module)
    targets = tuple(dataclasses.replace(t, module=module.__name__) for t in SPEC.targets)
    spec = dataclasses.replace(SPEC, targets=targets)
    with pytest.raises(PatchTargetError, match=rf"{expected}.*R1_ASCEND_DISABLE=vllm_engine_kv_cache_configs"):
        apply_one(spec)
    assert all(isinstance(target, Target) for target in targets)
    assert patched_by(module.unify_kv_cache_configs) is None, "nothing is installed when one target drifted"
