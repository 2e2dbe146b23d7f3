"""Compare the rollout's log-probs of its sampled tokens with the actor's every step; stop the run when they disagree.

Target:
driver — verl.trainer.ppo.ray_trainer.RayPPOTrainer.fit (wrapped: for the run it wraps the trainer's
``actor_rollout_wg.compute_log_prob`` and ``update_actor``, and the trainer's own ``_save_checkpoint`` and
``_load_checkpoint``, on the instance); worker — verl.trainer.ppo.rollout_corr_helper
compute_rollout_corr_metrics_from_logprobs (wrapped: also returns the partial sums of |Δ log-prob| of each update
micro-batch) and vllm.v1.sample.sampler.Sampler.forward (wrapped: the returned log-probs are those of the
temperature-scaled distribution the token was sampled from).

Upstream:
verl 0.6.1 and vllm 0.9.1. With ``actor_rollout_ref.rollout.calculate_log_probs`` the sync vLLM rollout returns
``rollout_log_probs`` (the engine's log-prob of each sampled token). ``RayPPOTrainer.fit`` runs the old-log-prob pass
(``compute_log_prob``) unless ``rollout_correction.bypass_mode``, then ``update_actor``; the Megatron actor's
``loss_func`` calls ``compute_rollout_corr_metrics_from_logprobs(log_prob, rollout_log_prob, response_mask)`` for every
micro-batch when ``rollout_log_probs`` is in the batch. vLLM 0.9.1's V1 ``Sampler.forward`` computes log-probs from
the raw logits, before temperature (later vLLM added ``logprobs_mode``).

Process:
driver (the TaskRunner running ``RayPPOTrainer.fit``) and worker (the Megatron actor and the in-process vLLM engine).

Why:
A rollout that decodes from wrong weights (a graph replaying freed parameter addresses, a weight sync that missed
parameters, a layout bug in the Megatron->HF export) produces plausible text and training goes on for many steps
on another policy's samples; issue reports across verl and vllm-ascend (wrong outputs after wake-up, accuracy loss
with EP/DP) show the class recurs. Each step the same tokens' log-probs are available from both sides, so the
disagreement can be measured for free and a broken rollout stopped at the first step. The comparison is only
meaningful at equal temperature, which vLLM 0.9.1 does not give (raw-logit log-probs against the actor's
``logits / temperature``; the recipes sample at 0.9).

How:
Settings under the top-level key ``r1_ascend.rollout_guard``: ``enabled`` (default true), the absolute levels
``warn.<statistic>`` and ``stop.<statistic>``, ``calibration.*`` and ``escalate_after`` (defaults and how they were
set: docs/rollout_guard.md "Levels"). When enabled, ``fit`` first requires ``calculate_log_probs``, then wraps the
worker group's methods and the trainer's checkpoint methods for the run. If the old-log-prob pass
ran, the driver compares its ``old_log_probs`` with ``rollout_log_probs`` over ``response_mask`` before the update;
if the on-policy shortcut (verl_onpolicy_logprob) skipped the pass, the actor's own log-probs from the update are
used: the wrapped metrics function emits per-micro-batch partials (sums, counts, maxima), verl merges them over
data-parallel ranks, and the driver folds them. The statistics (mean, per-sequence maximum and tail fraction of
|Δ log-prob|, KL estimators, the probability ratio error), the levels in force and the counts join the step's actor
metrics under ``rollout_guard/``. Each step is judged by ``rules.rollout_guard.GuardState``: the run's first
``calibration.steps`` healthy steps run at the absolute levels and measure its baseline; from then on each statistic
warns and stops at its factors times the baseline (never below its floor, never above the absolute level). A
statistic above its warn level logs a warning and sets ``rollout_guard/warned``; above its stop level (or NaN), or on
the ``escalate_after``-th warned step in a row, ``RolloutActorMismatchError`` names the step, the statistics, their
values, the levels and how they were set, and the likely causes. Before verl's ``_save_checkpoint`` (whose tracker
write names the step) the state — the calibration so far and the warned steps in a row — is written to
``global_step_N/rollout_guard.json``; after verl's ``_load_checkpoint`` resumed a step, it is read back from the
directory verl resumed from (``calibration.on_resume: recalibrate`` measures a new one). In the engine,
``Sampler.forward`` keeps upstream sampling
untouched and replaces only the returned log-probs by those of ``log_softmax(logits / temperature)`` (raw logits
for greedy rows), what the actor computes.
Caveats: weights one step stale differ from the actor by one update; whether that is caught depends on the
learning rate (docs/rollout_guard.md); top_p/top_k < 1 in training are not modelled by the actor either; with the
shortcut the stop comes after that step's update (before its checkpoint), without it before the update.

Upstream fix:
none at verl 0.6.1: ``calculate_debug_metrics`` logs ``training/rollout_probs_diff_*`` but never stops a run, and
compares probabilities at mismatched temperatures; vLLM >= 0.10.2 offers ``logprobs_mode="processed_logprobs"``.

Remove when:
verl stops a run on a rollout/actor log-prob mismatch above a configurable threshold and the pinned vLLM returns
processed (temperature-scaled) log-probs; then drop this patch and configure verl's check instead.

Disable:
R1_ASCEND_DISABLE=verl_rollout_guard — no comparison, no rollout_guard/* metrics, vLLM returns raw-logit
log-probs. Setting r1_ascend.rollout_guard.enabled=false keeps the patch installed but skips the comparison.
"""

from __future__ import annotations

import functools
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from r1_ascend.atomic import atomic_write_json

from ._install import install_on_import
from ._registry import PatchSpec, spec_by_module
from .rules import rollout_guard as guard

logger = logging.getLogger(__name__)

#: This patch's registry name (the R1_ASCEND_DISABLE token).
NAME = spec_by_module(__name__).name

#: Temperatures below this are greedy rows in vLLM's sampler (vllm.v1.sample.sampler._SAMPLING_EPS).
GREEDY_EPS = 1e-5


def apply(spec: PatchSpec) -> None:
    install_on_import(spec.name, spec.target("RayPPOTrainer.fit"), _build_fit)
    install_on_import(spec.name, spec.target("compute_rollout_corr_metrics_from_logprobs"), _build_metrics_fn)
    install_on_import(spec.name, spec.target("Sampler.forward"), _build_sampler_forward)


# --- driver ----------------------------------------------------------------------------------------------------


def _build_fit(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def fit(self: Any) -> Any:
        config = guard.GuardConfig.from_config(self.config)
        if not config.enabled:
            logger.warning(
                "patch %s: %s.enabled=false, rollout and actor log-probs are not compared", NAME, guard.CONFIG_KEY
            )
            return original(self)
        guard.check_rollout_config(self.config)
        group = self.actor_rollout_wg
        watcher = StepGuard(self, config)
        wrapped = {
            group: {
                "compute_log_prob": watcher.wrap_compute_log_prob(group.compute_log_prob),
                "update_actor": watcher.wrap_update_actor(group.update_actor),
            },
            self: {
                "_save_checkpoint": watcher.wrap_save(self._save_checkpoint),
                "_load_checkpoint": watcher.wrap_load(self._load_checkpoint),
            },
        }
        saved = {owner: {name: vars(owner).get(name) for name in names} for owner, names in wrapped.items()}
        for owner, methods in wrapped.items():
            for name, method in methods.items():
                setattr(owner, name, method)
        try:
            return original(self)
        finally:
            for owner, values in saved.items():
                for name, value in values.items():
                    if value is None:
                        vars(owner).pop(name, None)
                    else:
                        setattr(owner, name, value)

    return fit


class StepGuard:
    """Per-run state on the driver: measures each step from the old-log-prob pass or from the update's partials,
    judges it at the levels in force (:class:`rules.rollout_guard.GuardState`: calibration, escalation), and saves
    and restores that state with the trainer's checkpoints."""

    def __init__(self, trainer: Any, config: guard.GuardConfig) -> None:
        self.trainer = trainer
        self.config = config
        self.state = guard.GuardState()
        self.pending: tuple[guard.DiffStats, guard.Verdict] | None = None
        self.history: list[dict[str, float]] = []

    @property
    def step(self) -> int:
        return int(getattr(self.trainer, "global_steps", -1))

    def judge(self, stats: guard.DiffStats, *, in_update: bool) -> guard.Verdict:
        verdict = self.state.judge(stats, self.config, step=self.step, in_update=in_update)
        if verdict.warned:
            warned_steps = len(self.state.warned_run)
            logger.warning(
                guard.warning_message(verdict, step=self.step, warned_steps=warned_steps, config=self.config)
            )
        return verdict

    def wrap_compute_log_prob(self, compute: Callable[[Any], Any]) -> Callable[[Any], Any]:
        from .verl_onpolicy_logprob import MARKER

        def compute_log_prob(data: Any) -> Any:
            output = compute(data)
            self.pending = None
            if MARKER in output.meta_info:  # the on-policy shortcut skipped the pass: measured in the update
                return output
            stats = guard.DiffStats.from_tensors(
                output.batch["old_log_probs"], data.batch["rollout_log_probs"], data.batch["response_mask"]
            )
            self.pending = stats, self.judge(stats, in_update=False)  # a stop comes before the update
            return output

        return compute_log_prob

    def wrap_update_actor(self, update: Callable[[Any], Any]) -> Callable[[Any], Any]:
        def update_actor(data: Any) -> Any:
            output = update(data)
            metrics = output.meta_info.setdefault("metrics", {})
            from_update = guard.DiffStats.from_raw_metrics(metrics)
            for key in guard.RAW_KEYS:
                metrics.pop(key, None)
            pending, self.pending = self.pending, None
            if pending is not None:
                (stats, verdict), in_update = pending, False
            elif from_update is not None:
                stats, in_update = from_update, True
                verdict = self.judge(stats, in_update=True)
            else:
                msg = (
                    f"rollout guard: step {self.step} produced no rollout log-probs to compare (neither the "
                    f"old-log-prob pass nor the actor update saw 'rollout_log_probs'); the rollout must return them "
                    f"(actor_rollout_ref.rollout.calculate_log_probs=true) and the policy loss mode must not be "
                    f"'rollout_correction'"
                )
                raise guard.RolloutActorMismatchError(msg)
            values = guard.metrics(
                stats,
                verdict,
                in_update=in_update,
                calibrating=not verdict.levels.calibrated and self.config.calibration.steps > 0,
                warned_steps=len(self.state.warned_run),
            )
            self.history.append(values)
            metrics.update(values)
            return output

        return update_actor

    # --- the guard's state with the checkpoint ---------------------------------------------------------------

    def wrap_save(self, save: Callable[[], Any]) -> Callable[[], Any]:
        def _save_checkpoint() -> Any:
            # written before verl's save, whose last act names the step in the tracker: a tracked step has its state
            folder = checkpoint_root(self.trainer.config.trainer) / f"global_step_{self.step}"
            folder.mkdir(parents=True, exist_ok=True)
            atomic_write_json(folder / guard.STATE_FILE, self.state.record())
            return save()

        return _save_checkpoint

    def wrap_load(self, load: Callable[[], Any]) -> Callable[[], Any]:
        def _load_checkpoint() -> Any:
            result = load()
            if self.step > 0:  # verl resumed from global_step_<step>
                self.restore(resumed_folder(self.trainer.config.trainer, self.step))
            return result

        return _load_checkpoint

    def restore(self, folder: Path) -> None:
        """The state saved with the checkpoint in ``folder``, or a fresh calibration (``on_resume: recalibrate``, or
        a checkpoint saved without the guard's state), said in the log either way."""
        path = folder / guard.STATE_FILE
        if self.config.calibration.on_resume == guard.RESUME_RECALIBRATE:
            logger.warning(
                "patch %s: resumed from %s with calibration.on_resume=%s: the guard measures a new baseline over the "
                "next %d step(s), at the absolute levels meanwhile",
                NAME, folder, guard.RESUME_RECALIBRATE, self.config.calibration.steps,
            )  # fmt: skip
            return
        if not path.is_file():
            logger.warning(
                "patch %s: resumed from %s, which holds no %s (saved before the guard kept its state, or by a run "
                "with the guard off): the guard measures a new baseline over the next %d step(s)",
                NAME, folder, guard.STATE_FILE, self.config.calibration.steps,
            )  # fmt: skip
            return
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise guard.RolloutGuardConfigError(guard.unreadable_state(str(path), exc)) from exc
        self.state = guard.GuardState.from_record(record, str(path))
        levels = self.state.levels(self.config)
        done = "calibrated" if levels.calibrated else f"{len(self.state.calibration)} calibration step(s) measured"
        logger.warning(
            "patch %s: resumed the guard's state from %s: %s; %d warned step(s) in a row before the resume",
            NAME, path, done, len(self.state.warned_run),
        )  # fmt: skip


def checkpoint_root(trainer_config: Any) -> Path:
    """``trainer.default_local_dir`` as verl's ``_save_checkpoint`` and ``_load_checkpoint`` resolve it."""
    return Path(os.path.abspath(str(trainer_config.default_local_dir)))


def resumed_folder(trainer_config: Any, step: int) -> Path:
    """The ``global_step_<step>`` directory verl 0.6.1's ``_load_checkpoint`` resumed from: ``resume_from_path`` with
    ``resume_mode=resume_path``, else the tracked step under ``default_local_dir``."""
    if trainer_config.resume_mode == "resume_path" and trainer_config.get("resume_from_path"):
        return Path(os.path.abspath(str(trainer_config.resume_from_path)))
    return checkpoint_root(trainer_config) / f"global_step_{step}"


# --- worker: the actor update ---------------------------------------------------------------------------------


def _build_metrics_fn(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def compute_rollout_corr_metrics_from_logprobs(log_prob: Any, rollout_log_prob: Any, response_mask: Any) -> Any:
        result = dict(original(log_prob, rollout_log_prob, response_mask))
        result.update(guard.DiffStats.from_tensors(log_prob, rollout_log_prob, response_mask).as_raw_metrics())
        return result

    return compute_rollout_corr_metrics_from_logprobs


# --- worker: the vLLM engine's sampler ------------------------------------------------------------------------


def _build_sampler_forward(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def forward(self: Any, logits: Any, sampling_metadata: Any) -> Any:
        num_logprobs = sampling_metadata.max_num_logprobs
        if num_logprobs is None or sampling_metadata.all_greedy or sampling_metadata.temperature is None:
            return original(self, logits, sampling_metadata)
        processed = temperature_log_probs(logits, sampling_metadata.temperature)  # before upstream edits logits
        output = original(self, logits, sampling_metadata)
        sampled = output.sampled_token_ids[:, 0].long()
        output.logprobs_tensors = self.gather_logprobs(processed, num_logprobs, token_ids=sampled)
        return output

    return forward


def temperature_log_probs(logits: Any, temperature: Any) -> Any:
    """``log_softmax(logits / T)`` per row in float32; rows with T ~ 0 (greedy) keep the raw-logit log-probs."""
    import torch

    temp = temperature.to(device=logits.device, dtype=torch.float32)
    temp = torch.where(temp < GREEDY_EPS, torch.ones_like(temp), temp)
    return (logits.to(torch.float32) / temp.unsqueeze(1)).log_softmax(dim=-1)
