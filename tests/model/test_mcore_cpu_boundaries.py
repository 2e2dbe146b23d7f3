"""The CPU replacements' rules at their edges (r1_ascend.cpu.mcore), without building a model: the Adam
``step`` a resume loads is each state's own (torch's Adam, as megatron-core's load leaves it), and the signature
checks name every way an upstream target can change (a parameter renamed, reordered, added or dropped).

The resume test of the whole actor (``test_megatron_resume.py``, slow) shows the same fix on the real model path.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from r1_ascend.cpu import mcore as mcore_cpu


def adam_after_one_step(count: int = 3) -> tuple[torch.optim.Adam, list[torch.nn.Parameter]]:
    params = [torch.nn.Parameter(torch.full((4,), float(i + 1))) for i in range(count)]
    adam = torch.optim.Adam(params, lr=0.1)
    step(adam, params)
    return adam, params


def step(adam: torch.optim.Adam, params: list[torch.nn.Parameter]) -> None:
    adam.zero_grad()
    sum((p**2).sum() for p in params).backward()
    adam.step()


def megatron_load(self: Any, state_dict: dict[str, Any]) -> str:
    """What ``DistributedOptimizer.load_state_dict`` does with the Adam step (distrib_optimizer.py:740-743): one
    ``step`` tensor, put into every parameter's state."""
    shared = torch.tensor(float(state_dict["step"]))
    for state in self.optimizer.state.values():
        state["step"] = shared
    return "loaded"


def steps(adam: torch.optim.Adam, params: list[torch.nn.Parameter]) -> list[float]:
    return [float(adam.state[p]["step"]) for p in params]


def test_a_shared_step_runs_ahead_by_the_number_of_parameters() -> None:
    """The defect the replacement fixes, on torch's own Adam: it increments ``step`` in place per parameter."""
    adam, params = adam_after_one_step()
    megatron_load(SimpleNamespace(optimizer=adam), {"step": 5})
    step(adam, params)
    assert steps(adam, params) == [5.0 + len(params)] * len(params)


def test_after_a_load_each_state_counts_its_own_step() -> None:
    adam, params = adam_after_one_step()
    load = mcore_cpu.with_own_adam_steps(megatron_load)
    assert load(SimpleNamespace(optimizer=adam), {"step": 5}) == "loaded"
    step(adam, params)
    assert steps(adam, params) == [6.0] * len(params)


def test_the_update_after_a_load_is_that_of_an_uninterrupted_run() -> None:
    """Six steps in a row, or one step, a save of its states and a load of them into a fresh optimizer, then five
    more: the same parameters (bias correction included)."""
    straight, params = adam_after_one_step()
    for _ in range(5):
        step(straight, params)
    resumed, resumed_params = adam_after_one_step()
    saved = {p: {k: v.clone() for k, v in resumed.state[p].items() if k != "step"} for p in resumed_params}
    for p in resumed_params:
        resumed.state[p].update(saved[p])
    mcore_cpu.with_own_adam_steps(megatron_load)(SimpleNamespace(optimizer=resumed), {"step": 1})
    for _ in range(5):
        step(resumed, resumed_params)
    for a, b in zip(params, resumed_params, strict=True):
        torch.testing.assert_close(a, b)


def test_states_without_a_step_tensor_are_left_alone() -> None:
    """A precision-aware optimizer keeps no per-state tensor step: nothing to copy."""
    adam, params = adam_after_one_step(1)
    adam.state[params[0]]["step"] = 3
    mcore_cpu.with_own_adam_steps(lambda self, state_dict: None)(SimpleNamespace(optimizer=adam), {})
    assert adam.state[params[0]]["step"] == 3


def test_the_upstream_load_stays_reachable() -> None:
    """The resume test's control run undoes the replacement through ``__wrapped__``."""
    assert mcore_cpu.with_own_adam_steps(megatron_load).__wrapped__ is megatron_load


# --- signature checks ------------------------------------------------------------------------------------------


def function(signature: str) -> Any:
    namespace: dict[str, Any] = {}
    exec(f"def changed({signature}):\n    pass\n", namespace)
    return namespace["changed"]


def params_of(signature: str) -> list[str]:
    return [p.strip() for p in signature.split(",")]


@pytest.mark.parametrize(
    "signature",
    ["self, seed, name", "self, name, rng_seed", "self, name", "self, name, seed, device", "name, seed"],
    ids=["reordered", "renamed", "dropped", "added", "no-self"],
)
def test_a_changed_rng_tracker_add_is_named(monkeypatch: pytest.MonkeyPatch, signature: str) -> None:
    from megatron.core.tensor_parallel import random as tp_random

    monkeypatch.setattr(tp_random.CudaRNGStatesTracker, "add", function(signature))
    assert mcore_cpu.check_targets() == [
        f"CudaRNGStatesTracker.add(self, name, seed) changed to {params_of(signature)}"
    ]


@pytest.mark.parametrize(
    ("method", "signature", "wrap"),
    [
        ("_set_main_param_and_optimizer_states", "self, tensors, model_param", None),
        ("_set_main_param_and_optimizer_states", "self, model_param", None),
        ("state_dict", "self, keep_vars", None),
        ("_build_model_and_main_param_groups", "cls, gbuf_ranges, param_gbuf_map, opt_group_ranges", classmethod),
    ],
)
def test_a_changed_optimizer_method_is_named(
    monkeypatch: pytest.MonkeyPatch, method: str, signature: str, wrap: Any
) -> None:
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    replacement = function(signature)
    monkeypatch.setattr(DistributedOptimizer, method, wrap(replacement) if wrap else replacement)
    expected = tuple(params_of(signature))
    (problem,) = mcore_cpu.check_targets()
    assert problem.startswith(f"DistributedOptimizer.{method}(")
    assert problem.endswith(f"changed to {expected}")


def load_with_steps_of_their_own(self: Any, state_dict: Any) -> None:
    """An upstream load that gives every state its own step (the signature megatron-core 0.12.1 has)."""


def test_a_load_that_no_longer_shares_the_step_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """The replacement fixes a shared step; an upstream load without it needs the replacement reviewed."""
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    monkeypatch.setattr(DistributedOptimizer, "load_state_dict", load_with_steps_of_their_own)
    assert mcore_cpu.check_targets() == [
        "DistributedOptimizer.load_state_dict no longer shares one Adam step across the states"
    ]


def test_a_model_build_passes_its_config_to_get_model_and_reaches_every_listener(monkeypatch) -> None:
    """verl's ``make_megatron_module`` builds through ``get_model``: during the build it gets the TransformerConfig
    (its CPU branch then skips the 'cpu:cpu' move), afterwards ``get_model`` is upstream's again, even when the build
    fails, and every listener (the rehearsal's model record) sees the chunks once."""
    calls: list[dict[str, Any]] = []
    module = SimpleNamespace(get_model=lambda *args, **kwargs: calls.append(kwargs) or ["chunk"])
    upstream_get_model = module.get_model

    def make(wrap_config: Any, tf_config: Any, *args: Any, **kwargs: Any) -> list[str]:
        if kwargs.get("fail"):
            raise RuntimeError("build failed")
        return module.get_model(wrap_config)

    seen: list[Any] = []
    monkeypatch.setattr(mcore_cpu, "MODEL_LISTENERS", [seen.append, seen.append])
    wrapped = mcore_cpu.placing_on_cpu(make, module)
    config = object()
    assert wrapped("wrap", config) == ["chunk"]
    assert calls == [{"transformer_config": config}]
    assert seen == [["chunk"], ["chunk"]]
    assert module.get_model is upstream_get_model
    with pytest.raises(RuntimeError, match="build failed"):
        wrapped("wrap", config, fail=True)
    assert module.get_model is upstream_get_model
    assert len(seen) == 2, "a failed build reaches no listener"
