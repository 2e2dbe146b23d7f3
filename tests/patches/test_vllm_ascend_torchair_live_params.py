"""vllm_ascend_torchair_live_params: the real vllm-ascend 0.9.1 method is replaced by one that never freezes parameters.

Real: vllm-ascend's ``NPUModelRunner._get_torchair_lazy_compiled_model`` (its source is checked, and the stock method
is run side by side), ``torch.compile`` and ``check_engine_options``. Stand-ins, at the device boundary only: the
``torchair`` compiler (records the ``CompilerConfig`` it is given), ``patch_for_hcom``, ``torch.npu.set_compile_mode``
and ``get_ascend_config`` (vllm-ascend's global config needs a built engine).
"""

from __future__ import annotations

import textwrap
import types
from typing import Any

import pytest
import torch

from r1_ascend.patches import PatchTargetError, apply_one, get_original, patched_by, restore_all, spec_by_name
from r1_ascend.patches.rules.rollout_config import check_engine_options
from r1_ascend.patches.vllm_ascend_torchair_live_params import (
    METHOD,
    NAME,
    TorchairGraphConfigError,
    build,
    check_upstream,
)

SPEC = spec_by_name(NAME)


class FakeTorchair:
    """Records the compiler configs the runner builds; the backend is a plain dynamo backend."""

    def __init__(self) -> None:
        self.configs: list[Any] = []

    def CompilerConfig(self) -> Any:
        config = types.SimpleNamespace(experimental_config=types.SimpleNamespace())
        self.configs.append(config)
        return config

    def get_npu_backend(self, *, compiler_config: Any) -> Any:
        def backend(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
            return gm.forward

        backend.compiler_config = compiler_config
        return backend


@pytest.fixture
def device(monkeypatch: pytest.MonkeyPatch) -> FakeTorchair:
    from vllm_ascend.worker import model_runner_v1

    fake = FakeTorchair()
    calls: list[str] = []
    monkeypatch.setattr(model_runner_v1, "torchair", fake)
    monkeypatch.setattr(model_runner_v1, "patch_for_hcom", lambda: calls.append("hcom"))
    monkeypatch.setattr(
        model_runner_v1,
        "get_ascend_config",
        lambda: types.SimpleNamespace(torchair_graph_config=types.SimpleNamespace(enable_view_optimize=False)),
    )
    monkeypatch.setattr(torch.npu, "set_compile_mode", lambda **kw: calls.append(f"compile_mode {kw}"), raising=False)
    fake.calls = calls  # type: ignore[attr-defined]
    return fake


def _runner(*, cached: bool = False) -> Any:
    return types.SimpleNamespace(
        torchair_graph_batch_sizes=[8, 16],
        use_cached_npu_graph=cached,
        torchair_compiled_model=None,
        torchair_compiled_models={},
        model=torch.nn.Linear(4, 4),
    )


def test_applies_to_the_pinned_runner_and_restores() -> None:
    from vllm_ascend.worker.model_runner_v1 import NPUModelRunner

    stock = NPUModelRunner._get_torchair_lazy_compiled_model
    apply_one(SPEC)
    assert patched_by(NPUModelRunner._get_torchair_lazy_compiled_model) == NAME
    assert get_original(SPEC.target(METHOD)) is stock
    restore_all()
    assert NPUModelRunner._get_torchair_lazy_compiled_model is stock


def test_stock_method_freezes_parameters_and_the_patched_one_does_not(device: FakeTorchair) -> None:
    """The stand-in sees what the real upstream method configures: frozen, unlike the replacement."""
    from vllm_ascend.worker.model_runner_v1 import NPUModelRunner

    stock_runner = _runner()
    NPUModelRunner._get_torchair_lazy_compiled_model(stock_runner, 8)
    (stock_config,) = device.configs
    assert stock_config.experimental_config.frozen_parameter is True

    apply_one(SPEC)
    runner = _runner()
    compiled = NPUModelRunner._get_torchair_lazy_compiled_model(runner, 8)
    live_config = device.configs[-1]
    assert live_config is not stock_config
    assert live_config.experimental_config.frozen_parameter is False
    expected = {**vars(stock_config.experimental_config), "frozen_parameter": False}
    assert vars(live_config.experimental_config) == expected
    assert device.calls == ["hcom", "compile_mode {'jit_compile': False}"] * 2
    assert runner.torchair_compiled_model is compiled
    assert NPUModelRunner._get_torchair_lazy_compiled_model(runner, 16) is compiled, "compiled once, then cached"
    assert len(device.configs) == 2
    assert torch.equal(compiled(torch.ones(1, 4)), runner.model(torch.ones(1, 4)))


def test_compiled_graph_reads_reallocated_parameters(device: FakeTorchair) -> None:
    """Release/restore as the offloading rollout does, refill, and the compiled model computes with the new values."""
    from vllm_ascend.worker.model_runner_v1 import NPUModelRunner

    from r1_ascend.patches.impl import rollout_memory as memory

    apply_one(SPEC)
    runner = _runner()
    compiled = NPUModelRunner._get_torchair_lazy_compiled_model(runner, 8)
    x = torch.ones(1, 4)
    compiled(x)
    held = memory.release_parameter_storage(runner.model)
    memory.restore_parameter_storage(held)
    with torch.no_grad():
        runner.model.weight.fill_(2.0)
        runner.model.bias.fill_(1.0)
    assert torch.equal(compiled(x), torch.full((1, 4), 9.0))


def test_cached_graph_mode_and_bad_sizes_are_refused(device: FakeTorchair) -> None:
    from vllm_ascend.worker.model_runner_v1 import NPUModelRunner

    apply_one(SPEC)
    with pytest.raises(TorchairGraphConfigError, match="use_cached_graph: false"):
        NPUModelRunner._get_torchair_lazy_compiled_model(_runner(cached=True), 8)
    with pytest.raises(ValueError, match="Bad graph batch size:17"):
        NPUModelRunner._get_torchair_lazy_compiled_model(_runner(), 17)
    assert device.configs == []


def test_upstream_that_changed_a_mirrored_statement_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm_ascend.worker import model_runner_v1

    source = textwrap.dedent(
        """
        def _get_torchair_lazy_compiled_model(self, batch_size):
            patch_for_hcom()
            config = torchair.CompilerConfig()
            config.experimental_config.frozen_parameter = get_ascend_config().torchair_graph_config.frozen
            return config
        """
    )
    namespace = dict(vars(model_runner_v1))
    exec(compile(source, model_runner_v1.__file__, "exec"), namespace)
    drifted = namespace["_get_torchair_lazy_compiled_model"]
    drifted.__module__ = model_runner_v1.__name__
    import inspect

    real_getsource = inspect.getsource
    monkeypatch.setattr(inspect, "getsource", lambda obj: source if obj is drifted else real_getsource(obj))
    with pytest.raises(PatchTargetError, match=f"R1_ASCEND_DISABLE={NAME}") as info:
        build(drifted)
    monkeypatch.undo()
    assert "frozen_parameter = True" in str(info.value)
    check_upstream(model_runner_v1.NPUModelRunner._get_torchair_lazy_compiled_model)


def _rollout(**kwargs: Any) -> Any:
    torchair = kwargs.pop("torchair", None)
    additional = {"torchair_graph_config": torchair} if torchair is not None else {}
    base = {"enforce_eager": False, "max_num_seqs": 8, "engine_kwargs": {"vllm": {"additional_config": additional}}}
    return types.SimpleNamespace(**{**base, **kwargs})


@pytest.mark.parametrize(
    ("config", "model_type", "kwargs", "expected"),
    [
        (_rollout(), "qwen2", {}, "ACL graph mode"),
        (_rollout(torchair={"enabled": True}), "deepseek_v3", {"live_params": False}, "frozen parameters"),
        (_rollout(torchair={"enabled": True, "use_cached_graph": True}), "deepseek_v3", {}, "use_cached_graph=true"),
        (
            _rollout(torchair={"enabled": True, "enable_frozen_parameter": True}),
            "deepseek_v3",
            {},
            "enable_frozen_parameter=true",
        ),
    ],
)
def test_graph_modes_that_keep_addresses_are_refused_with_offloading(
    config: Any, model_type: str, kwargs: dict[str, bool], expected: str
) -> None:
    problems = check_engine_options(config, model_type=model_type, is_moe=False, dp_size=1, **kwargs)
    assert any(expected in problem for problem in problems), problems
    assert not check_engine_options(config, model_type=model_type, is_moe=False, dp_size=1, offload=False, **kwargs)


@pytest.mark.parametrize(
    ("config", "model_type"),
    [
        (_rollout(enforce_eager=True), "qwen2"),
        (_rollout(torchair={"enabled": True}), "deepseek_v3"),
        (_rollout(enforce_eager=True), "deepseek_v3"),
    ],
)
def test_safe_graph_modes_pass(config: Any, model_type: str) -> None:
    assert check_engine_options(config, model_type=model_type, is_moe=False, dp_size=1) == []
