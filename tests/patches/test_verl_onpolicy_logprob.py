"""verl_onpolicy_logprob: an exactly on-policy update uses log_prob.detach() and the extra pass is skipped.

The actor side runs verl 0.6.1's real ``MegatronPPOActor.forward_backward_batch`` (its real inner ``loss_func``
and the real registered policy loss) on a tiny torch model on CPU. Only what needs a Megatron process group is
replaced, inside verl's module namespace for the duration of a test: the pipeline broadcast, the Megatron
schedule (a plain loop doing what ``forward_backward_no_pipelining`` does: forward, loss, backward per micro-batch)
and the model forward (returning token log-probs). The driver side uses verl's real composed trainer config.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from omegaconf import DictConfig

from r1_ascend.patches import PatchError, apply_one, forget_applied, patched_by, restore_all, spec_by_name
from r1_ascend.patches.verl_onpolicy_logprob import (
    CONFIG_KEY,
    MARKER,
    METRIC,
    PlaceholderLogProb,
    enable_driver_shortcut,
    onpolicy_update,
    shortcut_decision,
)
from r1_ascend.testing.verl_config import compose_trainer as compose

SPEC = spec_by_name("verl_onpolicy_logprob")
PROMPT, RESPONSE, VOCAB = 3, 5, 11


ON_POLICY = (
    f"+{CONFIG_KEY}=true",
    "data.train_batch_size=4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.rollout.n=2",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
)


@pytest.fixture(scope="module")
def on_policy_config() -> DictConfig:
    return compose(*ON_POLICY)


# --- the decision --------------------------------------------------------------------------------------------------


def test_exactly_on_policy_config_turns_thedriver_shortcut_on(on_policy_config: DictConfig) -> None:
    assert shortcut_decision(on_policy_config) == (True, [])


@pytest.mark.parametrize(
    ("override", "reason"),
    [
        (f"{CONFIG_KEY}=false", "is not true"),
        ("actor_rollout_ref.actor.ppo_epochs=2", "ppo_epochs=2"),
        ("actor_rollout_ref.actor.ppo_mini_batch_size=2", "ppo_mini_batch_size=2 != data.train_batch_size=4"),
        ("algorithm.use_kl_in_reward=true", "use_kl_in_reward"),
        (
            ("actor_rollout_ref.rollout.calculate_log_probs=true", "algorithm.rollout_correction.rollout_is=token"),
            "rollout_is=token",
        ),
        (
            ("actor_rollout_ref.rollout.calculate_log_probs=true", "algorithm.rollout_correction.rollout_rs=token"),
            "rollout_rs=token",
        ),
        ("algorithm.rollout_correction.bypass_mode=true", "bypass_mode"),
    ],
)
def test_anything_but_exactly_on_policy_keeps_stock(override: str | tuple[str, ...], reason: str) -> None:
    overrides = (override,) if isinstance(override, str) else override
    active, reasons = shortcut_decision(compose(*ON_POLICY, *overrides))
    assert not active
    assert any(reason in r for r in reasons), reasons


def test_rollout_log_probs_alone_keep_the_shortcut() -> None:
    """The rollout guard needs calculate_log_probs; without IS/RS verl reads no old log-probs on the driver."""
    assert shortcut_decision(compose(*ON_POLICY, "actor_rollout_ref.rollout.calculate_log_probs=true")) == (True, [])


def test_switch_absent_means_off() -> None:
    assert shortcut_decision(compose())[0] is False


# --- the driver: the skipped pass ----------------------------------------------------------------------------------


class CountingWorkerGroup:
    """Records the calls the trainer makes; compute_log_prob answers like verl's Megatron worker would."""

    def __init__(self) -> None:
        self.compute_log_prob_calls = 0

    def compute_log_prob(self, data: Any) -> Any:
        from verl import DataProto

        self.compute_log_prob_calls += 1
        shape = data.batch["responses"].shape
        return DataProto.from_dict(
            tensors={"old_log_probs": torch.zeros(shape), "entropys": torch.ones(shape)},
            meta_info={"temperature": 1.0},
        )


@pytest.fixture
def trainer_with_stub_init(monkeypatch: pytest.MonkeyPatch) -> Iterator[type]:
    """RayPPOTrainer whose *original* init_workers only creates a counting worker group (no Ray, no GPUs)."""
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    def init_workers(self: Any) -> None:
        self.actor_rollout_wg = CountingWorkerGroup()

    monkeypatch.setattr(RayPPOTrainer, "init_workers", init_workers)
    try:
        yield RayPPOTrainer
    finally:  # undo the patch before monkeypatch puts verl's own init_workers back
        restore_all()
        forget_applied()


def _rollout_batch(n: int) -> Any:
    from verl import DataProto

    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, VOCAB, (n, PROMPT + RESPONSE), generator=generator)
    return DataProto.from_dict(
        tensors={
            "input_ids": input_ids,
            "responses": input_ids[:, PROMPT:],
            "attention_mask": torch.ones(n, PROMPT + RESPONSE, dtype=torch.long),
            "position_ids": torch.arange(PROMPT + RESPONSE).expand(n, -1).clone(),
            "response_mask": torch.ones(n, RESPONSE, dtype=torch.long),
            "advantages": torch.randn(n, RESPONSE, generator=generator),
        }
    )


def _old_log_prob_stage(trainer: Any, batch: Any) -> tuple[Any, float]:
    """What RayPPOTrainer.fit does in its "old_log_prob" stage (verl 0.6.1), using verl's own agg_loss."""
    from verl.trainer.ppo.core_algos import agg_loss

    old_log_prob = trainer.actor_rollout_wg.compute_log_prob(batch)
    entropy = agg_loss(
        loss_mat=old_log_prob.batch["entropys"], loss_mask=batch.batch["response_mask"], loss_agg_mode="token-mean"
    )
    old_log_prob.batch.pop("entropys")
    return batch.union(old_log_prob), entropy.item()


def test_on_policy_trainer_skips_the_old_log_prob_pass(
    trainer_with_stub_init: type, on_policy_config: DictConfig
) -> None:
    apply_one(SPEC)
    assert patched_by(trainer_with_stub_init.__dict__["init_workers"]) == "verl_onpolicy_logprob"
    trainer = object.__new__(trainer_with_stub_init)
    trainer.config = on_policy_config
    trainer.init_workers()

    batch, entropy = _old_log_prob_stage(trainer, _rollout_batch(8))

    assert isinstance(trainer.actor_rollout_wg.compute_log_prob, PlaceholderLogProb)
    assert trainer.actor_rollout_wg.compute_log_prob_calls == 0
    assert trainer.actor_rollout_wg.compute_log_prob.calls == 1
    assert torch.isnan(batch.batch["old_log_probs"]).all()
    assert batch.meta_info[MARKER] == 8
    assert batch.meta_info["temperature"] == on_policy_config.actor_rollout_ref.rollout.temperature
    assert entropy != entropy  # NaN: not measured under the shortcut


class RecordingBackend:
    def __init__(self) -> None:
        self.logged: list[dict[str, Any]] = []

    def log(self, data: dict[str, Any], step: int) -> None:
        self.logged.append(dict(data))


def _tracking_with_recorder() -> tuple[Any, RecordingBackend]:
    from verl.utils.tracking import Tracking

    tracking = object.__new__(Tracking)
    backend = RecordingBackend()
    tracking.logger = {"console": backend}
    return tracking, backend


def test_metrics_of_the_skipped_pass_are_not_logged_as_nan(
    trainer_with_stub_init: type, on_policy_config: DictConfig
) -> None:
    """verl derives actor/entropy and training/rollout_probs_diff_* from the placeholders: with the shortcut on,
    the NaN they become is left out of the log; measured values and any other NaN metric are still logged."""
    from r1_ascend.patches.verl_onpolicy_logprob import driver_shortcut_on

    nan = float("nan")
    metrics = {
        "actor/entropy": nan,
        "training/rollout_probs_diff_max": nan,
        "training/rollout_actor_probs_pearson_corr": nan,
        "actor/pg_loss": nan,
        "critic/score/mean": 0.5,
    }
    apply_one(SPEC)
    token = driver_shortcut_on.set(False)
    try:
        tracking, backend = _tracking_with_recorder()
        tracking.log(data=dict(metrics), step=1)
        assert set(backend.logged[-1]) == set(metrics)  # not enabled for a trainer: nothing filtered
        trainer = object.__new__(trainer_with_stub_init)
        trainer.config = on_policy_config
        trainer.init_workers()
        tracking.log(data=dict(metrics), step=2)
        assert set(backend.logged[-1]) == {"actor/pg_loss", "critic/score/mean"}
        tracking.log(data={"actor/entropy": 1.5}, step=3)
        assert backend.logged[-1] == {"actor/entropy": 1.5}
    finally:
        driver_shortcut_on.reset(token)


@pytest.mark.parametrize(
    "override", ["actor_rollout_ref.actor.ppo_epochs=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2"]
)
def test_two_updates_per_batch_keep_the_pass(trainer_with_stub_init: type, override: str) -> None:
    apply_one(SPEC)
    trainer = object.__new__(trainer_with_stub_init)
    trainer.config = compose(*ON_POLICY, override)
    trainer.init_workers()

    batch, entropy = _old_log_prob_stage(trainer, _rollout_batch(8))

    assert trainer.actor_rollout_wg.compute_log_prob_calls == 1
    assert MARKER not in batch.meta_info
    assert entropy == 1.0


def test_driver_helper_is_a_no_op_when_not_requested() -> None:
    trainer = types.SimpleNamespace(config=compose(), actor_rollout_wg=CountingWorkerGroup())
    assert enable_driver_shortcut(trainer) is False
    assert not isinstance(trainer.actor_rollout_wg.compute_log_prob, PlaceholderLogProb)


# --- the worker: verl's real Megatron actor update -----------------------------------------------------------------


class TinyPolicy(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(VOCAB, 8)
        self.head = torch.nn.Linear(8, VOCAB)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.embed(input_ids)))


def _tiny_forward(model: TinyPolicy, input_ids: torch.Tensor, logits_processor_args: dict, **_: Any) -> dict:
    """Stands in for verl's mcore GPT forward: token log-probs of the labels, like its logits_processor."""
    log_probs = torch.log_softmax(model(input_ids), dim=-1)
    label = logits_processor_args["label"]
    token = torch.gather(log_probs, -1, label.unsqueeze(-1)).squeeze(-1)
    return {"log_probs": token.masked_fill(~logits_processor_args["label_mask"], 0.0)}


def _no_pipelining_schedule(
    *, forward_step_func: Any, data_iterator: Any, model: Any, num_microbatches: int, forward_only: bool, **_: Any
) -> list:
    """Megatron's forward_backward_no_pipelining, minus process groups: forward, loss, backward per micro-batch."""
    results = []
    for _ in range(num_microbatches):
        output, loss_func = forward_step_func(data_iterator, model[0])
        loss, reduced = loss_func(output)
        if not forward_only:
            (loss / num_microbatches).backward()
        results.append(reduced)
    return results


@pytest.fixture
def megatron_actor(monkeypatch: pytest.MonkeyPatch, on_policy_config: DictConfig) -> Any:
    import verl.models.mcore
    import verl.workers.actor.megatron_actor as module

    monkeypatch.setattr(module, "broadcast_dict_tensor", lambda *a, **k: None)
    monkeypatch.setattr(module, "get_forward_backward_func", lambda: _no_pipelining_schedule)
    monkeypatch.setattr(
        module,
        "mpu",
        types.SimpleNamespace(
            get_pipeline_model_parallel_last_rank=lambda: 0,
            get_pipeline_model_parallel_group=lambda: None,
            get_virtual_pipeline_model_parallel_world_size=lambda: None,
            get_pipeline_model_parallel_world_size=lambda: 1,
        ),
    )
    monkeypatch.setattr(verl.models.mcore, "get_mcore_forward_fn", lambda hf_config: _tiny_forward)
    import megatron.core.parallel_state as parallel_state

    monkeypatch.setattr(parallel_state, "get_data_parallel_world_size", lambda *a, **k: 1)
    actor = object.__new__(module.MegatronPPOActor)
    actor.config = _actor_config(on_policy_config)
    actor.actor_module = [TinyPolicy()]
    actor.use_fused_kernels = False
    actor.hf_config = None
    return actor


def _actor_config(trainer_config: DictConfig, **changes: Any) -> Any:
    from verl.utils.config import omega_conf_to_dataclass

    config = trainer_config.actor_rollout_ref.actor.copy()
    config.ppo_mini_batch_size = 8  # verl's Megatron worker normalises it to sequences per data-parallel rank
    for key, value in changes.items():
        config[key] = value
    return omega_conf_to_dataclass(config)


def _update(actor: Any, batch: Any) -> dict:
    """One forward_backward_batch of verl's update_policy on the whole batch (one mini-batch)."""
    actor.actor_module[0].zero_grad()
    batch.meta_info.setdefault("temperature", 1.0)
    output = actor.forward_backward_batch(batch, calculate_entropy=False, micro_batch_size=2, mini_batch_size=8)
    metrics: dict[str, list] = {}
    for micro_metrics, _entropy in output["output"]:
        for key, value in micro_metrics.items():
            metrics.setdefault(key, []).extend(value if isinstance(value, list) else [value])
    return metrics


def _driver_batch(on_policy_config: DictConfig) -> Any:
    batch = _rollout_batch(8)
    placeholder = PlaceholderLogProb(temperature=on_policy_config.actor_rollout_ref.rollout.temperature)(batch)
    placeholder.batch.pop("entropys")
    return batch.union(placeholder)


def test_marked_update_has_ratio_exactly_one(megatron_actor: Any, on_policy_config: DictConfig) -> None:
    apply_one(SPEC)
    metrics = _update(megatron_actor, _driver_batch(on_policy_config))

    assert metrics["actor/pg_clipfrac"] == [0.0] * 4
    assert metrics["actor/ppo_kl"] == [0.0] * 4
    assert metrics[METRIC] == [1.0] * 4
    assert all(loss == loss for loss in metrics["actor/pg_loss"])  # finite although old_log_probs are NaN
    grads = [p.grad for p in megatron_actor.actor_module[0].parameters()]
    assert all(g is not None and torch.isfinite(g).all() and g.abs().sum() > 0 for g in grads)


def test_marked_update_equals_stock_update_with_exact_old_log_probs(
    megatron_actor: Any, on_policy_config: DictConfig
) -> None:
    """Same loss and gradient as stock verl fed the current policy's own log-probs (what on-policy means)."""
    batch = _rollout_batch(8)
    with torch.no_grad():
        exact = _tiny_forward(
            megatron_actor.actor_module[0],
            batch.batch["input_ids"],
            {"label": _labels(batch), "label_mask": _label_mask(batch)},
        )["log_probs"][:, -RESPONSE - 1 : -1]
    stock_batch = batch.union(_as_old_log_probs(exact))
    stock = _update(megatron_actor, stock_batch)
    stock_grads = [p.grad.clone() for p in megatron_actor.actor_module[0].parameters()]

    apply_one(SPEC)
    shortcut = _update(megatron_actor, _driver_batch(on_policy_config))
    shortcut_grads = [p.grad.clone() for p in megatron_actor.actor_module[0].parameters()]

    assert shortcut["actor/pg_loss"] == pytest.approx(stock["actor/pg_loss"], abs=1e-6)
    for ours, theirs in zip(shortcut_grads, stock_grads, strict=True):
        torch.testing.assert_close(ours, theirs)


def test_unmarked_update_is_stock(megatron_actor: Any) -> None:
    """Without the driver's marker the patched actor reads data["old_log_probs"] as verl does."""
    apply_one(SPEC)
    batch = _rollout_batch(8)
    shifted = _as_old_log_probs(torch.full((8, RESPONSE), -5.0))
    metrics = _update(megatron_actor, batch.union(shifted))
    assert METRIC not in metrics
    assert max(metrics["actor/pg_clipfrac"]) > 0


def test_placeholder_without_the_worker_patch_fails_loudly(megatron_actor: Any, on_policy_config: DictConfig) -> None:
    """A driver that skipped the pass paired with a stock actor gives a NaN loss, never a silent wrong ratio."""
    metrics = _update(megatron_actor, _driver_batch(on_policy_config))
    assert all(loss != loss for loss in metrics["actor/pg_loss"])


def test_actor_refuses_a_marker_it_cannot_honour(megatron_actor: Any, on_policy_config: DictConfig) -> None:
    apply_one(SPEC)
    megatron_actor.config = _actor_config(on_policy_config, ppo_epochs=2)
    with pytest.raises(PatchError, match="ppo_epochs=2"):
        _update(megatron_actor, _driver_batch(on_policy_config))
    megatron_actor.config = _actor_config(on_policy_config)
    batch = _driver_batch(on_policy_config)
    batch.meta_info[MARKER] = 16  # the driver saw a batch twice as large: this is one of two mini-batches
    with pytest.raises(PatchError, match="not be on-policy"):
        _update(megatron_actor, batch)


def test_forward_only_pass_is_untouched(megatron_actor: Any) -> None:
    apply_one(SPEC)
    with onpolicy_update():
        pass
    from verl.trainer.ppo.core_algos import get_policy_loss_fn as upstream
    from verl.workers.actor.megatron_actor import get_policy_loss_fn

    assert get_policy_loss_fn("vanilla") is upstream("vanilla")  # outside an update: verl's own loss


def _labels(batch: Any) -> torch.Tensor:
    label = batch.batch["position_ids"].clone()
    label[:, -RESPONSE - 1 : -1] = batch.batch["responses"]
    return label


def _label_mask(batch: Any) -> torch.Tensor:
    mask = batch.batch["attention_mask"].to(bool).clone()
    mask[:, : -RESPONSE - 1] = False
    mask[:, -1] = False
    return mask


def _as_old_log_probs(values: torch.Tensor) -> Any:
    from verl import DataProto

    return DataProto.from_dict(tensors={"old_log_probs": values.float()}, meta_info={"temperature": 1.0})


# --- the worker: the marker survives verl's own mini-batching -------------------------------------------------------


class _RecordingOptimizer:
    """Stands in for Megatron's optimizer: update_policy only calls zero_grad() and step()."""

    def __init__(self) -> None:
        self.steps = 0

    def zero_grad(self) -> None:
        pass

    def step(self) -> tuple[bool, float, int]:
        self.steps += 1
        return True, 0.0, 0


def _update_policy(actor: Any, batch: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[dict, int]:
    """verl's real update path: make_minibatch_iterator (select + make_iterator) then update_policy."""
    import verl.workers.actor.megatron_actor as module

    monkeypatch.setattr(module, "get_torch_device", lambda: types.SimpleNamespace(empty_cache=lambda: None))
    monkeypatch.setattr(actor.actor_module[0], "zero_grad_buffer", actor.actor_module[0].zero_grad, raising=False)
    actor.actor_optimizer = _RecordingOptimizer()
    actor.use_torch_profiler, actor.prof = False, None
    batch.meta_info.update(temperature=1.0, micro_batch_size=2)
    metrics = actor.update_policy(actor.make_minibatch_iterator(batch))
    flat = {
        key: [v for value in values for v in (value if isinstance(value, list) else [value])]
        for key, values in metrics.items()
    }
    return flat, actor.actor_optimizer.steps


def test_marker_reaches_the_loss_through_verl_update_policy(
    megatron_actor: Any, on_policy_config: DictConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver's marker survives verl's select()/make_iterator() mini-batching; one optimizer step, ratio 1."""
    apply_one(SPEC)
    metrics, steps = _update_policy(megatron_actor, _driver_batch(on_policy_config), monkeypatch)
    assert steps == 1
    assert metrics[METRIC] == [1.0] * 4
    assert metrics["actor/pg_clipfrac"] == [0.0] * 4
    assert all(loss == loss for loss in metrics["actor/pg_loss"])


def test_two_mini_batches_through_update_policy_are_refused(
    megatron_actor: Any, on_policy_config: DictConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker configured with two mini-batches per batch refuses the marker instead of using a ratio of 1."""
    apply_one(SPEC)
    megatron_actor.config = _actor_config(on_policy_config, ppo_mini_batch_size=4)
    with pytest.raises(PatchError, match="not be on-policy"):
        _update_policy(megatron_actor, _driver_batch(on_policy_config), monkeypatch)


# --- the worker: several actor data-parallel ranks ------------------------------------------------------------------


def _per_rank_updates(
    actor: Any, batch: Any, dp: int, mini_batch_per_rank: int, monkeypatch: pytest.MonkeyPatch
) -> list[tuple[dict, int]]:
    """What verl's Megatron worker group does with dp ranks: each rank gets batch.chunk(dp)[rank] and its own
    ppo_mini_batch_size (verl divides train_batch_size x n by dp); the DP size is what Megatron's parallel_state
    reports on that rank."""
    import megatron.core.parallel_state as parallel_state

    monkeypatch.setattr(parallel_state, "get_data_parallel_world_size", lambda *a, **k: dp)
    actor.config = _actor_config(actor.trainer_config, ppo_mini_batch_size=mini_batch_per_rank)
    return [_update_policy(actor, shard, monkeypatch) for shard in batch.chunk(dp)]


@pytest.mark.parametrize("dp", [2, 4])
def test_marker_holds_with_several_actor_dp_ranks(
    megatron_actor: Any, on_policy_config: DictConfig, monkeypatch: pytest.MonkeyPatch, dp: int
) -> None:
    """The driver marks the whole batch (8); each of dp ranks updates once on its 8 / dp sequences: on-policy."""
    apply_one(SPEC)
    megatron_actor.trainer_config = on_policy_config
    batch = _driver_batch(on_policy_config)
    results = _per_rank_updates(megatron_actor, batch, dp, 8 // dp, monkeypatch)
    assert len(results) == dp
    for metrics, steps in results:
        assert steps == 1
        assert set(metrics[METRIC]) == {1.0}
        assert set(metrics["actor/ppo_kl"]) == {0.0}


@pytest.mark.parametrize("dp", [2, 4])
def test_each_rank_with_two_mini_batches_is_refused(
    megatron_actor: Any, on_policy_config: DictConfig, monkeypatch: pytest.MonkeyPatch, dp: int
) -> None:
    """Per-rank mini-batch half of its share: each rank would step twice. The check must multiply by DP to see it
    (without the multiplication the per-rank share alone never equals the marked batch; with the wrong factor a
    correct layout would be refused, which the test above rules out)."""
    apply_one(SPEC)
    megatron_actor.trainer_config = on_policy_config
    with pytest.raises(PatchError, match=rf"mini-batches of {8 // dp // 2} x {dp} data-parallel ranks"):
        _per_rank_updates(megatron_actor, _driver_batch(on_policy_config), dp, 8 // dp // 2, monkeypatch)
