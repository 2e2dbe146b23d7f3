"""verl_moe_expert_load: the actor's per-step expert load, from megatron-core's own router counts, in verl's metrics.

Runs verl 0.6.1's real ``MegatronPPOActor.update_policy`` on an actor whose model is a stack of megatron-core 0.12.1
``TopKRouter`` modules (sigmoid scores, expert bias, group-limited top-k), in a one-rank gloo world with Megatron's
parallel state. Each micro-batch routes random logits through the routers' own ``routing`` (which counts
``local_tokens_per_expert``), and each optimizer step ends with megatron-core's own ``_update_router_expert_bias``
(what ``finalize_model_grads`` calls), so the patch sees exactly what it sees in a run. The expected counts are
summed independently from the routing maps.
"""

from __future__ import annotations

import importlib
import logging
import math
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from r1_ascend.patches import Status, apply_all, apply_one, patched_by, spec_by_name
from r1_ascend.patches import verl_moe_expert_load as patch
from r1_ascend.patches.rules import expert_load as rule

SPEC = spec_by_name(rule.PATCH)
EXPERTS = 8
#: megatron-core layer numbers (from 1) of the MoE layers; layer 1 is dense, as DeepSeek-V3's first layers are.
MOE_LAYERS = (2, 3, 4)


@pytest.fixture(scope="module")
def megatron_world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    from megatron.core import parallel_state as mpu

    init = tmp_path_factory.mktemp("pg") / "store"
    torch.distributed.init_process_group("gloo", init_method=f"file://{init}", rank=0, world_size=1)
    mpu.initialize_model_parallel()
    yield
    mpu.destroy_model_parallel()
    torch.distributed.destroy_process_group()


@pytest.fixture(autouse=True)
def _cpu_empty_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """verl's update_policy ends with get_torch_device().empty_cache(); torch.cpu has none."""
    monkeypatch.setattr(torch.cpu, "empty_cache", lambda: None, raising=False)


def moe_config(**overrides: Any) -> Any:
    from megatron.core.transformer import TransformerConfig

    settings = {
        "num_layers": 4,
        "hidden_size": 16,
        "num_attention_heads": 2,
        "num_moe_experts": EXPERTS,
        "moe_router_topk": 2,
        "moe_router_score_function": "sigmoid",
        "moe_router_enable_expert_bias": True,
        "moe_router_bias_update_rate": 0.001,
        "moe_router_load_balancing_type": "none",
        "moe_router_num_groups": 2,
        "moe_router_group_topk": 1,
        "use_cpu_initialization": True,
        "add_bias_linear": False,
    }
    settings.update(overrides)
    return TransformerConfig(**settings)


class Chunk(torch.nn.Module):
    """A model chunk as verl's actor holds it: the routers, and the DDP buffer hook update_policy calls."""

    def __init__(self, routers: list[torch.nn.Module]) -> None:
        super().__init__()
        self.routers = torch.nn.ModuleList(routers)

    def zero_grad_buffer(self) -> None:
        pass


def make_actor(config: Any, tokens: int = 12, seed: int = 0) -> tuple[Any, dict[int, torch.Tensor]]:
    """A MegatronPPOActor (built without its __init__) whose forward-backward routes ``tokens`` random tokens per
    micro-batch through megatron-core's routers; returns it and the expected counts by HF layer (filled as it runs)."""
    from megatron.core.transformer.moe.router import TopKRouter
    from verl.workers.actor.megatron_actor import MegatronPPOActor

    # the module, not the function megatron.core.distributed re-exports under the same name
    finalize = importlib.import_module("megatron.core.distributed.finalize_model_grads")
    routers = []
    if config.num_moe_experts:
        for number in MOE_LAYERS:
            router = TopKRouter(config)
            router.set_layer_number(number)
            routers.append(router)
    chunks = [Chunk(routers)]
    expected: dict[int, torch.Tensor] = {number - 1: torch.zeros(EXPERTS) for number in MOE_LAYERS}
    generator = torch.Generator().manual_seed(seed)

    def forward_backward_batch(data: Any, **_: Any) -> dict[str, Any]:
        with torch.enable_grad():
            for router in routers:
                logits = torch.randn(tokens, EXPERTS, generator=generator) * 2.0
                _, routing_map = router.routing(logits)
                expected[router.layer_number - 1] += routing_map.sum(dim=0).float()
        if config.moe_router_enable_expert_bias:
            finalize._update_router_expert_bias(chunks, config)  # what finalize_model_grads does after backward
        return {"output": [({"actor/pg_loss": 0.0}, None, None)]}

    actor = object.__new__(MegatronPPOActor)
    actor.config = SimpleNamespace(
        entropy_coeff=0.0, use_dynamic_bsz=False, ppo_micro_batch_size_per_gpu=1, ppo_mini_batch_size=1
    )
    actor.tf_config = config
    actor.actor_module = chunks
    actor.actor_optimizer = SimpleNamespace(zero_grad=lambda: None, step=lambda: (True, 1.0, 0))
    actor.use_torch_profiler = False
    actor.prof = None
    actor.forward_backward_batch = forward_backward_batch
    return actor, expected


def update(actor: Any, optimizer_steps: int = 2) -> dict[str, Any]:
    from verl.workers.actor.megatron_actor import MegatronPPOActor

    batches = [SimpleNamespace(meta_info={"micro_batch_size": 1}) for _ in range(optimizer_steps)]
    return MegatronPPOActor.update_policy(actor, iter(batches))


@pytest.fixture
def listened() -> Iterator[list[patch.StepLoad]]:
    loads: list[patch.StepLoad] = []
    patch.LOAD_LISTENERS.append(loads.append)
    yield loads
    patch.LOAD_LISTENERS.remove(loads.append)


def test_each_step_logs_the_load_megatron_core_counted(megatron_world: None, listened: list) -> None:
    """Two optimizer steps in one update: the moe/ metrics are those of the summed routing maps, per HF layer."""
    from verl.workers.actor.megatron_actor import MegatronPPOActor

    assert apply_one(SPEC) is Status.APPLIED
    assert patched_by(MegatronPPOActor.update_policy) == SPEC.name
    actor, expected = make_actor(moe_config())
    metrics = update(actor, optimizer_steps=2)
    want = rule.step_metrics({layer: counts.tolist() for layer, counts in expected.items()}, ep_size=1)
    assert {k: v for k, v in metrics.items() if k.startswith(rule.PREFIX) and k != rule.TELEMETRY_MS} == want
    assert metrics["actor/pg_loss"] == [0.0, 0.0]  # update_policy's own metrics are kept
    assert metrics[rule.TELEMETRY_MS] >= 0.0
    (load,) = listened
    assert load.optimizer_steps == 2
    assert sorted(load.tokens) == [1, 2, 3]
    assert sum(load.tokens[1]) == 2 * 12 * 2  # 2 steps x 12 tokens x top-2


def test_the_counts_restart_with_each_update(megatron_world: None, listened: list) -> None:
    apply_one(SPEC)
    actor, expected = make_actor(moe_config())
    update(actor, optimizer_steps=1)
    first = {layer: counts.clone() for layer, counts in expected.items()}
    update(actor, optimizer_steps=1)
    second = {layer: (expected[layer] - first[layer]).tolist() for layer in expected}
    assert listened[1].tokens == second


def test_the_listener_sees_the_bias_after_the_update(megatron_world: None, listened: list) -> None:
    """Every expert's bias moves by the update rate, in the direction that balances it (megatron-core's rule)."""
    apply_one(SPEC)
    actor, expected = make_actor(moe_config())
    update(actor, optimizer_steps=1)
    (load,) = listened
    routers = patch.stage_routers(actor.actor_module)
    for router in routers:
        layer = router.layer_number - 1
        assert load.bias[layer] == router.expert_bias.tolist()
        counts = expected[layer]
        for expert, bias in enumerate(load.bias[layer]):
            direction = math.copysign(1.0, counts.mean().item() - counts[expert].item())
            if counts[expert] != counts.mean():
                assert bias == pytest.approx(direction * 0.001)


def test_switched_off_logs_nothing(megatron_world: None, listened: list) -> None:
    from verl.workers.actor.megatron_actor import MegatronPPOActor

    stock = MegatronPPOActor.update_policy
    results = apply_all(disabled=[SPEC.name], specs=(SPEC,))
    assert [r.status for r in results] == [Status.DISABLED]
    assert MegatronPPOActor.update_policy is stock
    actor, _ = make_actor(moe_config())
    metrics = update(actor)
    assert not [key for key in metrics if key.startswith(rule.PREFIX)]
    assert listened == []


def test_a_dense_model_adds_nothing(megatron_world: None, listened: list) -> None:
    apply_one(SPEC)
    no_moe = {"moe_router_enable_expert_bias": False, "moe_router_num_groups": None, "moe_router_group_topk": None}
    dense = moe_config(num_moe_experts=None, **no_moe)
    actor, _ = make_actor(dense)
    metrics = update(actor)
    assert not [key for key in metrics if key.startswith(rule.PREFIX)]
    assert listened == []


def test_routers_without_expert_bias_are_named_once(
    megatron_world: None, listened: list, caplog: pytest.LogCaptureFixture
) -> None:
    """megatron-core counts tokens only for its bias update: without it there is nothing to log, and it says so."""
    apply_one(SPEC)
    actor, _ = make_actor(moe_config(moe_router_enable_expert_bias=False))
    with caplog.at_level(logging.WARNING, logger=patch.__name__):
        first, second = update(actor), update(actor)
    assert not [key for key in {**first, **second} if key.startswith(rule.PREFIX)]
    warnings = [r for r in caplog.records if "without an expert bias" in r.getMessage()]
    assert len(warnings) == 1
    assert listened == []
