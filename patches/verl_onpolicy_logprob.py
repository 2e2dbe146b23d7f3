"""On an exactly on-policy update, reuse the current log-probs as old log-probs and skip that pass.

Target:
driver — verl.trainer.ppo.ray_trainer.RayPPOTrainer.init_workers (afterwards the trainer's actor worker
group answers compute_log_prob without running it); worker — verl.workers.actor.megatron_actor
MegatronPPOActor.forward_backward_batch (marks an on-policy update) and the module-level name get_policy_loss_fn
that its inner loss_func looks up at call time (the policy loss then gets log_prob.detach() as old_log_prob);
driver — verl.utils.tracking.Tracking.log (leaves out the NaN metrics verl derives from the skipped pass).

Upstream:
verl 0.6.1 (RayPPOTrainer.fit's "old_log_prob" stage; megatron_actor's loss_func reading
data["old_log_probs"]; dp_actor.DataParallelPPOActor.update_policy, whose on_policy branch, verl#3119, is the
reference behaviour).

Process:
driver (the TaskRunner that runs RayPPOTrainer) and worker (the Megatron actor).

Why:
with ppo_epochs == 1 and one mini-batch equal to the train batch, the old policy is the current policy, so
the importance ratio must be exactly 1. verl's Megatron actor instead takes old log-probs from a separate
forward-only pass (about a tenth of the step time at DeepSeek-V3 scale) that runs with other micro-batch sizes, so
NPU kernels and MoE dispatch make the ratio differ from 1 and clipping acts on noise. verl's FSDP actor already
uses log_prob.detach() in that case; the Megatron actor does not, and the trainer always runs the extra pass.

How:
switched on by the top-level config key r1_ascend.onpolicy_logprob_shortcut=true (verl's actor and algorithm
dataclasses reject unknown keys, so it cannot live there). When the trainer's workers are built, the driver
decides from the whole config: on only if ppo_epochs == 1, ppo_mini_batch_size == data.train_batch_size (verl
multiplies both by rollout.n, so one mini-batch then holds the whole batch), use_kl_in_reward is false,
rollout_correction.bypass_mode is false, and, when rollout.calculate_log_probs is true, rollout_correction sets
none of rollout_is, rollout_rs, rollout_token_veto_threshold (those read old log-probs on the driver; with all of
them null verl only logs rollout_corr/* and training/rollout_probs_diff_* metrics, which are then NaN, and the
verl_rollout_guard patch measures the mismatch inside the update instead).
If requested but not eligible it logs why and keeps stock behaviour. When on, compute_log_prob returns
NaN placeholders for old_log_probs and entropys plus a marker in meta_info holding the batch size, without calling
the workers. On the worker, forward_backward_batch sees the marker, checks ppo_epochs == 1 and that its mini-batch
times the data-parallel size is that batch size, and within the update the policy loss receives
old_log_prob = log_prob.detach() (pg_clipfrac and ppo_kl are 0 by construction; actor/onpolicy_shortcut = 1 is
logged). A placeholder reaching a stock loss makes the loss NaN, so a half-applied overlay fails loudly.
Lost metrics: actor/entropy and verl's training/rollout_probs_diff_* / rollout_actor_probs_pearson_corr come from
the skipped pass; while the shortcut is on, the driver's Tracking.log leaves them out (only when they are NaN, as
the placeholders make them) instead of logging NaN. Computing the entropy in the update would keep the
vocabulary-wide entropy in the backward graph at 671B scale; the rollout guard measures the rollout/actor gap.

Upstream fix:
none at verl 0.6.1. verl's rollout_correction.bypass_mode skips the pass but uses the rollout
engine's log-probs (a different policy on NPU); an upstream on_policy branch in megatron_actor plus a trainer flag
to skip compute_log_prob would make this patch unnecessary.

Remove when:
verl's megatron_actor.MegatronPPOActor uses log_prob.detach() when len(mini_batches) == 1 and
ppo_epochs == 1, and RayPPOTrainer.fit skips actor_rollout_wg.compute_log_prob in that case.

Disable:
R1_ASCEND_DISABLE=verl_onpolicy_logprob — stock verl: the old-log-prob pass runs every step, actor/entropy
is measured, and the importance ratio is computed against the separate pass. Setting
r1_ascend.onpolicy_logprob_shortcut=false (the default) has the same effect while leaving the patch installed.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import logging
from collections.abc import Callable, Iterator
from typing import Any

from ._errors import PatchError
from ._install import install_on_import
from ._registry import PatchSpec, spec_by_module

logger = logging.getLogger(__name__)

#: This patch's registry name (the R1_ASCEND_DISABLE token).
NAME = spec_by_module(__name__).name

#: The recipe switch (top level of the Hydra config; ``+r1_ascend.onpolicy_logprob_shortcut=true`` on the CLI).
CONFIG_KEY = "r1_ascend.onpolicy_logprob_shortcut"
#: meta_info key carried from the driver's placeholder to the actor update: the number of sequences in the batch.
MARKER = "r1_ascend_onpolicy_batch_size"
#: Metric logged by the actor when the shortcut was used for an update.
METRIC = "actor/onpolicy_shortcut"
#: Metrics verl derives from the skipped pass's outputs (the NaN placeholders): not logged while the shortcut is on.
PLACEHOLDER_METRICS = ("actor/entropy", "training/rollout_probs_diff_", "training/rollout_actor_probs_pearson_corr")
#: rollout_correction settings with which verl's driver reads old log-probs (given rollout log-probs) before the update.
READS_OLD_LOG_PROBS = ("rollout_is", "rollout_rs", "rollout_token_veto_threshold")

_active: contextvars.ContextVar[bool] = contextvars.ContextVar("r1_ascend_onpolicy_update", default=False)
#: Set on the driver when the shortcut was enabled for the trainer (the placeholders are in use).
driver_shortcut_on: contextvars.ContextVar[bool] = contextvars.ContextVar("r1_ascend_onpolicy_driver", default=False)


def apply(spec: PatchSpec) -> None:
    install_on_import(spec.name, spec.target("RayPPOTrainer.init_workers"), _build_init_workers)
    install_on_import(spec.name, spec.target("MegatronPPOActor.forward_backward_batch"), _build_forward_backward_batch)
    install_on_import(spec.name, spec.target("get_policy_loss_fn"), _build_get_policy_loss_fn)
    install_on_import(spec.name, spec.target("Tracking.log"), _build_tracking_log)


# --- the decision (driver) ----------------------------------------------------------------------------------------


def shortcut_decision(config: Any) -> tuple[bool, list[str]]:
    """``(active, reasons)``: whether the update is exactly on-policy and the switch is on; reasons if not."""
    from omegaconf import OmegaConf

    if not OmegaConf.select(config, CONFIG_KEY, default=False):
        return False, [f"{CONFIG_KEY} is not true"]
    actor = config.actor_rollout_ref.actor
    rollout = config.actor_rollout_ref.rollout
    reasons = []
    if actor.ppo_epochs != 1:
        reasons.append(f"actor_rollout_ref.actor.ppo_epochs={actor.ppo_epochs} (needs 1)")
    if actor.ppo_mini_batch_size != config.data.train_batch_size:
        reasons.append(
            f"actor_rollout_ref.actor.ppo_mini_batch_size={actor.ppo_mini_batch_size} != "
            f"data.train_batch_size={config.data.train_batch_size} (needs one mini-batch per step)"
        )
    if config.algorithm.get("use_kl_in_reward", False):
        reasons.append("algorithm.use_kl_in_reward=true (the KL reward reads old log-probs on the driver)")
    correction = config.algorithm.get("rollout_correction") or {}
    if rollout.get("calculate_log_probs", False):
        for key in READS_OLD_LOG_PROBS:
            if correction.get(key) is not None:
                reasons.append(
                    f"algorithm.rollout_correction.{key}={correction.get(key)} with rollout.calculate_log_probs=true "
                    f"(rollout correction weights or rejects tokens using old log-probs on the driver)"
                )
    if correction.get("bypass_mode", False):
        reasons.append("algorithm.rollout_correction.bypass_mode=true (verl already skips the pass)")
    return not reasons, reasons


# --- driver: answer compute_log_prob without running it ----------------------------------------------------------


class PlaceholderLogProb:
    """Stands in for the worker group's ``compute_log_prob``: NaN placeholders plus the on-policy marker."""

    def __init__(self, temperature: float) -> None:
        self.temperature = temperature
        self.calls = 0

    def __call__(self, data: Any) -> Any:
        import torch
        from verl import DataProto

        self.calls += 1
        responses = data.batch["responses"]
        nan = torch.full(responses.shape, float("nan"), dtype=torch.float32)
        return DataProto.from_dict(
            tensors={"old_log_probs": nan, "entropys": nan.clone()},
            meta_info={"temperature": self.temperature, MARKER: len(data)},
        )


def _build_init_workers(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def init_workers(self: Any) -> Any:
        result = original(self)
        enable_driver_shortcut(self)
        return result

    return init_workers


def enable_driver_shortcut(trainer: Any) -> bool:
    """Make ``trainer.actor_rollout_wg.compute_log_prob`` a placeholder when the decision says so."""
    active, reasons = shortcut_decision(trainer.config)
    requested = not reasons or reasons[0] != f"{CONFIG_KEY} is not true"
    if not active:
        if requested:
            logger.warning(
                "%s requested but the update is not exactly on-policy, keeping verl's old-log-prob pass: %s",
                CONFIG_KEY,
                "; ".join(reasons),
            )
        return False
    temperature = trainer.config.actor_rollout_ref.rollout.temperature
    trainer.actor_rollout_wg.compute_log_prob = PlaceholderLogProb(temperature)
    driver_shortcut_on.set(True)
    logger.warning(
        "patch %s: exactly on-policy update; the old-log-prob pass is skipped and actor/entropy is not logged", NAME
    )
    return True


def _placeholder_metric(name: str, value: Any) -> bool:
    import math

    is_nan = isinstance(value, float) and math.isnan(value)
    return is_nan and any(name == p or (p.endswith("_") and name.startswith(p)) for p in PLACEHOLDER_METRICS)


def _build_tracking_log(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def log(self: Any, data: Any, step: Any, backend: Any = None) -> Any:
        if driver_shortcut_on.get() and isinstance(data, dict):
            data = {k: v for k, v in data.items() if not _placeholder_metric(k, v)}
        return original(self, data, step, backend)

    return log


# --- worker: the actor update --------------------------------------------------------------------------------------


@contextlib.contextmanager
def onpolicy_update() -> Iterator[None]:
    """Within the block, policy losses looked up by the Megatron actor use ``log_prob.detach()`` as old log-prob."""
    token = _active.set(True)
    try:
        yield
    finally:
        _active.reset(token)


def _build_forward_backward_batch(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def forward_backward_batch(self: Any, data: Any, forward_only: bool = False, *args: Any, **kwargs: Any) -> Any:
        expected = data.meta_info.get(MARKER) if not forward_only else None
        if expected is None:
            return original(self, data, forward_only, *args, **kwargs)
        _check_actor_is_on_policy(self, len(data), expected)
        with onpolicy_update():
            return original(self, data, forward_only, *args, **kwargs)

    return forward_backward_batch


def _check_actor_is_on_policy(actor: Any, mini_batch_len: int, batch_size: int) -> None:
    from megatron.core import parallel_state as mpu

    epochs = actor.config.ppo_epochs
    dp_size = mpu.get_data_parallel_world_size()
    if epochs != 1 or mini_batch_len * dp_size != batch_size:
        msg = (
            f"patch {NAME!r}: the driver skipped the old-log-prob pass for a batch of {batch_size} sequences, but "
            f"this actor updates with ppo_epochs={epochs} on mini-batches of {mini_batch_len} x {dp_size} "
            f"data-parallel ranks; the update would not be on-policy. Set {CONFIG_KEY}=false or make "
            f"ppo_mini_batch_size equal data.train_batch_size with ppo_epochs=1, or disable with "
            f"R1_ASCEND_DISABLE={NAME}."
        )
        raise PatchError(msg)


def _build_get_policy_loss_fn(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def get_policy_loss_fn(name: Any) -> Any:
        loss_fn = original(name)
        return _on_policy(loss_fn) if _active.get() else loss_fn

    return get_policy_loss_fn


def _on_policy(loss_fn: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(loss_fn)

    @functools.wraps(loss_fn)
    def on_policy_loss(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        bound.arguments["old_log_prob"] = bound.arguments["log_prob"].detach()
        loss, metrics = loss_fn(*bound.args, **bound.kwargs)
        metrics = dict(metrics)
        metrics[METRIC] = 1.0
        return loss, metrics

    return on_policy_loss
