"""verl_rollout_guard: a rollout whose log-probs disagree with the actor's stops the run; a healthy one does not.

Real: vLLM 0.9.1's ``Sampler`` (sampling and log-prob gathering, through the patched ``forward``), verl 0.6.1's
``compute_rollout_corr_metrics_from_logprobs`` (through the patched module attribute, as the Megatron actor's
``loss_func`` calls it), ``DataProto.concat`` (verl's merge of metrics over data-parallel ranks), ``reduce_metrics``,
the composed trainer config and the on-policy shortcut's ``PlaceholderLogProb``; the wrapped target is verl's
``RayPPOTrainer.fit``. Stand-ins: verl's fit loop body (a loop running the same stages in the same order:
generate, old-log-prob pass unless skipped, update), the Megatron actor (a tiny torch policy updated by SGD, its
micro-batches split over data-parallel "ranks") and the engine's model (the same tiny policy in bf16, whose weights
are either synced from the actor or, for the stale case, read from memory that no longer holds them).
"""

from __future__ import annotations

import itertools
import json
import math
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import DictConfig, OmegaConf

from r1_ascend.patches import apply_one, forget_applied, patched_by, restore_all, spec_by_name
from r1_ascend.patches.rules import rollout_guard as guard
from r1_ascend.patches.verl_onpolicy_logprob import PlaceholderLogProb
from r1_ascend.testing.verl_config import compose_trainer as compose

SPEC = spec_by_name("verl_rollout_guard")
PROMPT, RESPONSE, VOCAB, HIDDEN = 4, 12, 64, 16
BATCH, TEMPERATURE, STEPS = 16, 0.9, 4


BASE = (
    "actor_rollout_ref.rollout.calculate_log_probs=true",
    f"actor_rollout_ref.rollout.temperature={TEMPERATURE}",
    "trainer.resume_mode=disable",
)


@pytest.fixture(scope="module")
def base_config() -> DictConfig:
    return compose(*BASE)


def _config(base: DictConfig, **guard_settings: Any) -> DictConfig:
    config = base.copy()
    if guard_settings:
        OmegaConf.set_struct(config, False)
        config.r1_ascend = {"rollout_guard": guard_settings}
    return config


class TinyPolicy(torch.nn.Module):
    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.embed = torch.nn.Embedding(VOCAB, HIDDEN)
        self.head = torch.nn.Linear(HIDDEN, VOCAB)
        with torch.no_grad():
            self.head.weight.mul_(8.0)  # peaked next-token distributions, like a trained LM's

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.embed(input_ids)))


def _sampling_metadata(n: int, generator: torch.Generator) -> Any:
    from vllm.v1.sample.metadata import SamplingMetadata

    return SamplingMetadata(
        temperature=torch.full((n,), TEMPERATURE),
        all_greedy=False,
        all_random=True,
        top_p=None,
        top_k=None,
        min_p=None,
        generators=dict.fromkeys(range(n), generator),
        max_num_logprobs=0,
        no_penalties=True,
        prompt_token_ids=None,
        frequency_penalties=torch.zeros(n),
        presence_penalties=torch.zeros(n),
        repetition_penalties=torch.ones(n),
        output_token_ids=[[] for _ in range(n)],
        min_tokens={},
        logit_bias=[None] * n,
        allowed_token_ids_mask=None,
        bad_words_token_ids={},
    )


class StandInEngine:
    """Decodes with vLLM's real Sampler from its own bf16 copy of the policy; ``mode`` says what weights it reads."""

    def __init__(self, actor: TinyPolicy, mode: str) -> None:
        from vllm.v1.sample.sampler import Sampler

        self.actor, self.mode = actor, mode
        self.model = TinyPolicy().to(torch.bfloat16)
        self.sampler = Sampler()
        self.generator = torch.Generator().manual_seed(1)
        self.steps = 0

    def sync_weights(self) -> None:
        """The weight sync. With a stale address the engine keeps reading the old, since-reused memory."""
        self.steps += 1
        with torch.no_grad():
            if self.mode == "stale_address" and self.steps > 1:
                for param in self.model.parameters():
                    param.normal_(generator=self.generator)  # what the freed blocks hold now (other tensors' data)
                return
            for mine, theirs in zip(self.model.parameters(), self.actor.parameters(), strict=True):
                mine.copy_(theirs)

    def generate(self, prompts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.sync_weights()
        ids, logprobs = prompts, []
        with torch.no_grad():
            for _ in range(RESPONSE):
                logits = self.model(ids)[:, -1].float()
                out = self.sampler(logits, _sampling_metadata(len(ids), self.generator))
                ids = torch.cat([ids, out.sampled_token_ids.long()], dim=1)
                logprobs.append(out.logprobs_tensors.logprobs[:, 0])
        return ids, torch.stack(logprobs, dim=1)


def actor_log_probs(policy: TinyPolicy, input_ids: torch.Tensor) -> torch.Tensor:
    """Token log-probs of the responses at the sampling temperature, as verl's actor computes them."""
    logits = policy(input_ids[:, :-1]) / TEMPERATURE
    token = torch.log_softmax(logits.float(), dim=-1).gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return token[:, -RESPONSE:]


class StandInWorkerGroup:
    """The actor worker group: generation, the old-log-prob pass and an SGD update over ``dp`` ranks; checkpoints
    are a marker file each (what verl's trainer asks of the group when it saves and resumes)."""

    def __init__(self, engine_mode: str, *, dp: int = 2, micro: int = 4, lr: float = 0.5) -> None:
        self.policy = TinyPolicy()
        self.engine = StandInEngine(self.policy, engine_mode)
        self.dp, self.micro, self.lr = dp, micro, lr
        self.prompts = torch.randint(0, VOCAB, (BATCH, PROMPT), generator=torch.Generator().manual_seed(2))
        #: per saved step: whether the guard's state was already on disk when verl's save began
        self.state_before_save: dict[int, bool] = {}
        self.loaded: list[str | None] = []

    def save_checkpoint(self, local_path: str, hdfs_path: Any, global_step: int, max_ckpt_to_keep: Any) -> None:
        self.state_before_save[global_step] = (Path(local_path).parent / guard.STATE_FILE).is_file()
        Path(local_path).mkdir(parents=True, exist_ok=True)
        (Path(local_path) / "marker").write_text(str(global_step))

    def load_checkpoint(self, path: str | None, del_local_after_load: bool = False) -> None:
        self.loaded.append(path)

    def generate_sequences(self, _prompts: Any) -> Any:
        from verl import DataProto

        ids, rollout_log_probs = self.engine.generate(self.prompts)
        return DataProto.from_dict(
            tensors={
                "input_ids": ids,
                "responses": ids[:, PROMPT:],
                "response_mask": torch.ones(BATCH, RESPONSE, dtype=torch.long),
                "rollout_log_probs": rollout_log_probs,
            }
        )

    def compute_log_prob(self, data: Any) -> Any:
        from verl import DataProto

        with torch.no_grad():
            old = actor_log_probs(self.policy, data.batch["input_ids"])
        return DataProto.from_dict(tensors={"old_log_probs": old, "entropys": torch.zeros_like(old)})

    def update_actor(self, data: Any) -> Any:
        """Each rank runs its micro-batches through loss_func's metrics call, then all ranks' metrics are merged."""
        from verl import DataProto
        from verl.trainer.ppo import rollout_corr_helper

        rank_outputs = []
        self.policy.zero_grad()
        for shard in data.chunk(self.dp):
            metrics: dict[str, list[float]] = {}
            for micro in shard.split(self.micro):
                log_prob = actor_log_probs(self.policy, micro.batch["input_ids"])
                stats = rollout_corr_helper.compute_rollout_corr_metrics_from_logprobs(
                    log_prob=log_prob,
                    rollout_log_prob=micro.batch["rollout_log_probs"],
                    response_mask=micro.batch["response_mask"],
                )
                for key, value in stats.items():
                    metrics.setdefault(key, []).append(value)
                (-log_prob.mean()).backward()  # a policy-gradient-like step that moves the policy
            rank_outputs.append(DataProto(meta_info={"metrics": metrics}))
        with torch.no_grad():
            for param in self.policy.parameters():
                param -= self.lr * param.grad
        return DataProto.concat(rank_outputs)


def stand_in_fit(self: Any) -> None:
    """verl 0.6.1 ``RayPPOTrainer.fit``'s stage order for each step, without Ray or reward: verl's own
    ``_load_checkpoint`` first, then ``self.steps`` steps, each saved with verl's own ``_save_checkpoint`` when its
    number is a multiple of ``self.save_freq`` (0: never)."""
    from verl.utils.metric import reduce_metrics

    self.global_steps = 0
    self._load_checkpoint()
    self.global_steps += 1
    self.logged = []
    for _ in range(self.steps):
        batch = self.actor_rollout_wg.generate_sequences(None)
        old = self.actor_rollout_wg.compute_log_prob(batch)
        old.batch.pop("entropys")
        batch = batch.union(old)
        output = self.actor_rollout_wg.update_actor(batch)
        self.logged.append(reduce_metrics(output.meta_info["metrics"]))
        if self.save_freq and self.global_steps % self.save_freq == 0:
            self._save_checkpoint()
        self.global_steps += 1


class StandInDataLoader:
    def state_dict(self) -> dict[str, int]:
        return {"position": 0}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.state = state


@pytest.fixture
def trainer_class(monkeypatch: pytest.MonkeyPatch) -> Iterator[type]:
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    monkeypatch.setattr(RayPPOTrainer, "fit", stand_in_fit)
    apply_one(SPEC)
    try:
        yield RayPPOTrainer
    finally:
        restore_all()
        forget_applied()


def _trainer(
    trainer_class: type,
    config: DictConfig,
    group: StandInWorkerGroup,
    *,
    shortcut: bool = False,
    steps: int = STEPS,
    save_freq: int = 0,
) -> Any:
    trainer = object.__new__(trainer_class)
    trainer.config = config
    trainer.actor_rollout_wg = group
    trainer.steps, trainer.save_freq = steps, save_freq
    trainer.use_critic = False
    trainer.train_dataloader = StandInDataLoader()
    if shortcut:  # what verl_onpolicy_logprob's init_workers does on an exactly on-policy config
        group.compute_log_prob = PlaceholderLogProb(TEMPERATURE)
    return trainer


# --- the run ----------------------------------------------------------------------------------------------------


def _gated(metrics: dict[str, float]) -> dict[str, float]:
    return {name: metrics[guard.METRIC_NAMES[name]] for name in guard.GATED}


def _levels(metrics: dict[str, float], prefix: str) -> dict[str, float]:
    return {name: metrics[guard.level_key(prefix, name)] for name in guard.GATED}


@pytest.mark.parametrize("shortcut", [False, True], ids=["old-log-prob-pass", "on-policy-shortcut"])
def test_healthy_bf16_rollout_runs_every_step_and_logs_the_guard(
    trainer_class: type, base_config: DictConfig, shortcut: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """The first calibration.steps steps run at the absolute levels; the next at levels calibrated from them, logged
    with the baseline they come from."""
    trainer = _trainer(trainer_class, base_config, StandInWorkerGroup("synced"), shortcut=shortcut)
    assert patched_by(trainer_class.__dict__["fit"]) == SPEC.name
    trainer.fit()
    config = guard.GuardConfig.from_config(base_config)
    calibration = config.calibration.steps
    assert len(trainer.logged) == STEPS > calibration
    baseline = guard.baseline_of([_gated(m) for m in trainer.logged[:calibration]])
    calibrated = guard.calibrated_levels(baseline, config)
    for number, metrics in enumerate(trainer.logged, start=1):
        calibrating = number <= calibration
        levels = guard.Levels.absolute(config) if calibrating else calibrated
        assert _levels(metrics, guard.WARN_PREFIX) == levels.warn, number
        assert _levels(metrics, guard.STOP_PREFIX) == levels.stop, number
        assert metrics[guard.METRIC_CALIBRATING] == float(calibrating)
        if calibrating:
            assert not any(key.startswith(guard.BASELINE_PREFIX) for key in metrics)
        else:
            assert _levels(metrics, guard.BASELINE_PREFIX) == baseline
        assert all(_gated(metrics)[name] <= levels.warn[name] for name in guard.GATED), number
        assert 0 < metrics[guard.METRIC_MEAN] <= metrics[guard.METRIC_MAX]
        assert metrics[guard.METRIC_TOKENS] == BATCH * RESPONSE
        assert metrics[guard.METRIC_SEQUENCES] == BATCH
        assert (metrics[guard.METRIC_WARNED], metrics[guard.METRIC_WARNED_STEPS]) == (0.0, 0.0)
        assert metrics[guard.METRIC_IN_UPDATE] == float(shortcut)
        assert not set(guard.RAW_KEYS) & set(metrics), "partials are folded, not logged"
    assert calibrated.warn != config.warn, "calibrated levels are tighter than the caps here"
    assert "above the warn level" not in caplog.text
    assert "compute_log_prob" not in vars(trainer.actor_rollout_wg) or shortcut, "the run's wrappers are removed"
    assert "_save_checkpoint" not in vars(trainer), "the run's wrappers are removed"


@pytest.mark.parametrize("shortcut", [False, True], ids=["old-log-prob-pass", "on-policy-shortcut"])
def test_rollout_from_stale_weights_stops_the_run(trainer_class: type, base_config: DictConfig, shortcut: bool) -> None:
    trainer = _trainer(trainer_class, base_config, StandInWorkerGroup("stale_address"), shortcut=shortcut)
    with pytest.raises(guard.RolloutActorMismatchError) as info:
        trainer.fit()
    message = str(info.value)
    assert "at training step 2 " in message, "step 1 decodes from the freshly synced weights"
    assert f"{guard.METRIC_MEAN} = " in message
    assert f"(level {guard.DEFAULT_STOP['abs_diff_mean']:g})" in message
    assert "stale or garbage weights" in message
    assert ("inside the actor update" in message) is shortcut
    assert len(trainer.logged) == 1, "step 1 completed and was logged"
    assert trainer.logged[0][guard.METRIC_MEAN] < guard.DEFAULT_STOP["abs_diff_mean"]


def test_without_the_guard_the_stale_run_trains_on(trainer_class: type, base_config: DictConfig) -> None:
    """Nothing else notices: switched off, the same broken rollout runs every step."""
    trainer = _trainer(trainer_class, _config(base_config, enabled=False), StandInWorkerGroup("stale_address"))
    trainer.fit()
    assert len(trainer.logged) == STEPS
    assert guard.METRIC_MEAN not in trainer.logged[-1]


def test_levels_are_configurable(trainer_class: type, base_config: DictConfig) -> None:
    tight = {"abs_diff_mean": 1e-6}
    trainer = _trainer(trainer_class, _config(base_config, warn=tight, stop=tight), StandInWorkerGroup("synced"))
    with pytest.raises(
        guard.RolloutActorMismatchError, match=r"at training step 1 .*log_prob_abs_diff_mean = \S+ nats \(level 1e-06\)"
    ):
        trainer.fit()


def test_a_step_above_warn_but_below_stop_is_logged_and_flagged(
    trainer_class: type, base_config: DictConfig, caplog: pytest.LogCaptureFixture
) -> None:
    settings = {"warn": {"abs_diff_mean": 1e-6}, "escalate_after": 0}
    trainer = _trainer(trainer_class, _config(base_config, **settings), StandInWorkerGroup("synced"))
    trainer.fit()
    assert len(trainer.logged) == STEPS, "with escalation off a warning never stops the run"
    assert all(metrics[guard.METRIC_WARNED] == 1.0 for metrics in trainer.logged)
    assert [m[guard.METRIC_WARNED_STEPS] for m in trainer.logged] == [1.0, 2.0, 3.0, 4.0]
    warnings = [r.getMessage() for r in caplog.records if "above the warn level" in r.getMessage()]
    assert len(warnings) == STEPS
    assert "rollout_guard/log_prob_abs_diff_mean = " in warnings[0]
    assert "(level 1e-06)" in warnings[0]
    assert "the run is still calibrating" in warnings[0], "a warned step is not learned: calibration never ends"


def test_warned_steps_in_a_row_escalate_to_a_stop(trainer_class: type, base_config: DictConfig) -> None:
    escalate_after = guard.GuardConfig.from_config(base_config).escalate_after
    trainer = _trainer(trainer_class, _config(base_config, warn={"abs_diff_mean": 1e-6}), StandInWorkerGroup("synced"))
    with pytest.raises(guard.RolloutActorMismatchError) as info:
        trainer.fit()
    message = str(info.value)
    assert message.startswith(f"rollout guard: escalated to a stop at training step {escalate_after}: ")
    assert f"rollout_guard/log_prob_abs_diff_mean above its warn level in {escalate_after} of them" in message
    assert len(trainer.logged) == escalate_after - 1, "the warned steps before it ran and were logged"


def test_guard_needs_the_rollout_log_probs(trainer_class: type) -> None:
    trainer = _trainer(trainer_class, compose(), StandInWorkerGroup("synced"))
    with pytest.raises(guard.RolloutGuardConfigError, match="calculate_log_probs=true"):
        trainer.fit()


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({"enabled": "yes"}, "must be true or false"),
        ({"stop": {"abs_diff_mean": 0}}, "positive finite number"),
        ({"warn": {"kl_k3": math.inf}}, "positive finite number"),
        ({"stop": {"kl_k3": True}}, "positive finite number"),
        ({"stop": {"abs_diff_median": 0.1}}, "unknown statistic"),
        ({"stop": 0.1}, "must be a mapping"),
        ({"warn": {"tail_fraction": 0.5}, "stop": {"tail_fraction": 0.1}}, "must not exceed its stop level"),
        ({"max_mean_abs_diff": 1.0}, "replaced by r1_ascend.rollout_guard.stop.abs_diff_mean"),
        ({"threshold": 1.0}, "unknown key"),
    ],
)
def test_bad_settings_are_refused(base_config: DictConfig, settings: dict, expected: str) -> None:
    with pytest.raises(guard.RolloutGuardConfigError, match=expected):
        guard.GuardConfig.from_config(_config(base_config, **settings))


def test_defaults_are_on_with_the_measured_levels(base_config: DictConfig) -> None:
    config = guard.GuardConfig.from_config(base_config)
    assert config.enabled
    assert (config.warn, config.stop) == (guard.DEFAULT_WARN, guard.DEFAULT_STOP)
    assert all(config.warn[n] <= config.stop[n] for n in guard.GATED)
    assert (config.calibration, config.escalate_after) == (guard.Calibration(), guard.DEFAULT_ESCALATE_AFTER)


def test_a_level_not_given_keeps_its_default(base_config: DictConfig) -> None:
    config = guard.GuardConfig.from_config(_config(base_config, stop={"kl_k3": 0.5}))
    assert config.stop == {**guard.DEFAULT_STOP, "kl_k3": 0.5}
    assert config.warn == guard.DEFAULT_WARN


def test_shipped_configs_enable_the_guard_and_the_rollout_log_probs() -> None:
    root = Path(__file__).resolve().parents[2] / "recipe" / "config"
    for path in sorted(root.glob("*.yaml")):
        overlay = OmegaConf.load(path)
        assert overlay.r1_ascend.rollout_guard.enabled is True, path.name
        assert overlay.actor_rollout_ref.rollout.calculate_log_probs is True, path.name
        levels = guard.GuardConfig.from_config(overlay)  # valid, and every level is written out
        for level in ("warn", "stop"):
            assert set(overlay.r1_ascend.rollout_guard[level]) == set(guard.GATED), (path.name, level)
        assert levels.enabled
    deepseek = guard.GuardConfig.from_config(OmegaConf.load(root / "grpo_deepseekv3_671b.yaml"))
    assert deepseek == guard.GuardConfig(), "the 671B config's guard settings are the code's defaults"
    smoke = guard.GuardConfig.from_config(OmegaConf.load(root / "grpo_deepseekv3_smoke.yaml"))
    assert smoke == deepseek, "the smoke run (and the CPU rehearsal built on it) guards as the 671B run does"


# --- the guard's state with the checkpoint -----------------------------------------------------------------------


def _resumable(base: DictConfig, root: Path, *extra: str, **guard_settings: Any) -> DictConfig:
    config = _config(base, **guard_settings)
    OmegaConf.set_struct(config, False)
    config.trainer.resume_mode, config.trainer.default_local_dir = "auto", str(root)
    for item in extra:
        key, value = item.split("=", 1)
        OmegaConf.update(config, key, value)
    return config


def _run(trainer_class: type, config: DictConfig, *, steps: int, save_freq: int) -> Any:
    trainer = _trainer(trainer_class, config, StandInWorkerGroup("synced"), steps=steps, save_freq=save_freq)
    trainer.fit()
    return trainer


def test_the_calibration_is_saved_with_each_checkpoint_and_restored_on_resume(
    trainer_class: type, base_config: DictConfig, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A relaunch from a checkpoint taken after calibration gates its first step at the same calibrated levels."""
    config = _resumable(base_config, tmp_path)
    calibration = guard.GuardConfig.from_config(config).calibration.steps
    first = _run(trainer_class, config, steps=calibration + 1, save_freq=1)
    saved = json.loads((tmp_path / f"global_step_{calibration + 1}" / guard.STATE_FILE).read_text())
    assert [o["step"] for o in saved["calibration"]] == list(range(1, calibration + 1))
    assert all(first.actor_rollout_wg.state_before_save.values()), "the state is on disk before verl's save"

    second = _run(trainer_class, config, steps=1, save_freq=0)
    assert second.actor_rollout_wg.loaded == [str(tmp_path / f"global_step_{calibration + 1}" / "actor")]
    (resumed,) = second.logged
    assert resumed[guard.METRIC_CALIBRATING] == 0.0
    for prefix in (guard.BASELINE_PREFIX, guard.WARN_PREFIX, guard.STOP_PREFIX):
        assert _levels(resumed, prefix) == _levels(first.logged[-1], prefix), prefix
    assert "resumed the guard's state from" in caplog.text


def test_a_resume_before_calibration_ends_continues_it(
    trainer_class: type, base_config: DictConfig, tmp_path: Path
) -> None:
    config = _resumable(base_config, tmp_path)
    calibration = guard.GuardConfig.from_config(config).calibration.steps
    first = _run(trainer_class, config, steps=calibration - 1, save_freq=calibration - 1)
    second = _run(trainer_class, config, steps=2, save_freq=0)
    last_calibration, first_gated = second.logged
    assert (last_calibration[guard.METRIC_CALIBRATING], first_gated[guard.METRIC_CALIBRATING]) == (1.0, 0.0)
    measured = [_gated(m) for m in [*first.logged, last_calibration]]
    assert _levels(first_gated, guard.BASELINE_PREFIX) == guard.baseline_of(measured)


@pytest.mark.parametrize("why", ["recalibrate", "no-state"])
def test_a_resume_can_measure_a_new_baseline(
    trainer_class: type, base_config: DictConfig, tmp_path: Path, caplog: pytest.LogCaptureFixture, why: str
) -> None:
    """``calibration.on_resume: recalibrate``, or a checkpoint without the guard's state (saved by an earlier
    release): the resumed run calibrates again from its first step, and says so."""
    config = _resumable(base_config, tmp_path)
    calibration = guard.GuardConfig.from_config(config).calibration.steps
    _run(trainer_class, config, steps=calibration + 1, save_freq=calibration + 1)
    if why == "recalibrate":
        config = _resumable(base_config, tmp_path, calibration={"on_resume": "recalibrate"})
    else:
        (tmp_path / f"global_step_{calibration + 1}" / guard.STATE_FILE).unlink()
    second = _run(trainer_class, config, steps=calibration + 1, save_freq=0)
    assert [m[guard.METRIC_CALIBRATING] for m in second.logged] == [1.0] * calibration + [0.0]
    expected = "with calibration.on_resume=recalibrate" if why == "recalibrate" else "which holds no rollout_guard.json"
    assert expected in caplog.text


def test_a_resume_from_a_given_path_reads_the_state_there(
    trainer_class: type, base_config: DictConfig, tmp_path: Path
) -> None:
    """The checkpoint copied elsewhere; the one under default_local_dir lost its state."""
    config = _resumable(base_config, tmp_path / "run")
    calibration = guard.GuardConfig.from_config(config).calibration.steps
    first = _run(trainer_class, config, steps=calibration + 1, save_freq=calibration + 1)
    saved = tmp_path / "run" / f"global_step_{calibration + 1}"
    at = tmp_path / "kept" / saved.name
    shutil.copytree(saved, at)
    (saved / guard.STATE_FILE).unlink()
    second = _run(
        trainer_class,
        _resumable(base_config, tmp_path / "run", "trainer.resume_mode=resume_path", f"trainer.resume_from_path={at}"),
        steps=1,
        save_freq=0,
    )
    assert second.actor_rollout_wg.loaded == [str(at / "actor")]
    assert _levels(second.logged[0], guard.BASELINE_PREFIX) == _levels(first.logged[-1], guard.BASELINE_PREFIX)


def test_a_damaged_state_stops_the_resume_naming_the_file(
    trainer_class: type, base_config: DictConfig, tmp_path: Path
) -> None:
    config = _resumable(base_config, tmp_path)
    _run(trainer_class, config, steps=1, save_freq=1)
    state = tmp_path / "global_step_1" / guard.STATE_FILE
    state.write_text("{not json")
    with pytest.raises(guard.RolloutGuardConfigError, match=f"the rollout guard's state saved in {state} cannot be"):
        _run(trainer_class, config, steps=1, save_freq=0)


# --- the statistics -------------------------------------------------------------------------------------------


def test_nan_never_looks_healthy() -> None:
    stats = guard.DiffStats.from_tensors(torch.full((2, 3), math.nan), torch.zeros(2, 3), torch.ones(2, 3))
    with pytest.raises(guard.RolloutActorMismatchError):
        guard.check(stats, guard.GuardConfig(), step=3, in_update=False)


def test_padding_outside_the_mask_is_ignored() -> None:
    actor = torch.tensor([[-1.0, -2.0, 0.0]])
    rollout = torch.tensor([[-1.5, -2.0, -1.0]])  # verl pads rollout log-probs with -1
    stats = guard.DiffStats.from_tensors(actor, rollout, torch.tensor([[1, 1, 0]]))
    assert (stats.abs_sum, stats.tokens, stats.abs_max) == (0.5, 2, 0.5)
    assert (stats.sequences, stats.seq_mean_max, stats.tail_count) == (1, 0.25, 0)


def test_statistics_match_their_definitions() -> None:
    """Each statistic against a direct computation over the valid tokens (the KL estimators as verl's rollout_corr
    computes them, the probability ratio error as NeMo-RL does)."""
    generator = torch.Generator().manual_seed(8)
    actor, rollout = -torch.rand(5, 7, generator=generator) * 3, -torch.rand(5, 7, generator=generator) * 3
    mask = (torch.rand(5, 7, generator=generator) > 0.3).long()
    mask[2] = 0  # a sequence without response tokens is not a sequence here
    values = guard.DiffStats.from_tensors(actor, rollout, mask).statistics()
    delta = (actor - rollout)[mask.bool()]
    per_seq = [((actor - rollout)[i][mask[i].bool()]).abs().mean() for i in range(5) if mask[i].any()]
    expected = {
        "abs_diff_mean": delta.abs().mean(),
        "abs_diff_max": delta.abs().max(),
        "seq_abs_diff_median": torch.tensor(per_seq).quantile(0.5),
        "seq_abs_diff_max": max(per_seq),
        "tail_fraction": (delta.abs() > guard.TAIL_CUT).float().mean(),
        "kl_k1": (-delta).mean(),
        "kl_k3": (delta.exp() - delta - 1).mean(),
        "prob_mult_error": delta.abs().exp().mean(),
    }
    for name, value in expected.items():
        assert values[name] == pytest.approx(float(value), rel=1e-5, abs=1e-7), name


@pytest.mark.parametrize(
    ("shape", "statistic"),
    [
        ("few tokens far off", "tail_fraction"),
        ("one sequence off", "seq_abs_diff_max"),
        ("everything a little off", "abs_diff_mean"),
    ],
)
def test_each_gated_statistic_sees_its_fault_shape_where_the_mean_does_not(shape: str, statistic: str) -> None:
    """A partial fault diluted below the mean's stop level is still stopped by the statistic made for its shape."""
    generator = torch.Generator().manual_seed(9)
    rows, cols = 64, 256
    actor = -torch.rand(rows, cols, generator=generator) * 4
    noise = torch.randn(rows, cols, generator=generator) * 0.002  # healthy bf16 level
    rollout = actor + noise
    levels = guard.GuardConfig()
    if shape == "few tokens far off":  # 8 % of tokens (those routed through one broken expert) 1 nat off
        hit = torch.rand(rows, cols, generator=generator) < 0.08
        rollout = torch.where(hit, actor - 1.0, rollout)
    elif shape == "one sequence off":  # one sequence from a bad slot
        rollout[5] = actor[5] - 1.0
    else:
        rollout = actor + torch.randn(rows, cols, generator=generator) * 0.3
    verdict = guard.Verdict.judge(guard.DiffStats.from_tensors(actor, rollout, torch.ones(rows, cols)), levels)
    assert statistic in verdict.stopped
    if statistic != "abs_diff_mean":
        assert "abs_diff_mean" not in verdict.stopped, "the mean alone would have let it through"


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, 12),
    cols=st.integers(1, 9),
    cuts=st.lists(st.integers(1, 11), max_size=4),
    seed=st.integers(0, 2**16),
    scale=st.sampled_from([0.01, 1.0, 5.0]),
)
def test_any_split_over_ranks_and_micro_batches_folds_to_the_whole(
    rows: int, cols: int, cuts: list[int], seed: int, scale: float
) -> None:
    generator = torch.Generator().manual_seed(seed)
    actor = torch.randn(rows, cols, generator=generator) * scale
    rollout = torch.randn(rows, cols, generator=generator) * scale
    mask = (torch.rand(rows, cols, generator=generator) > 0.4).long()
    whole = guard.DiffStats.from_tensors(actor, rollout, mask)
    bounds = sorted({0, rows, *(c for c in cuts if c < rows)})
    per_rank = [
        {k: [v] for k, v in guard.DiffStats.from_tensors(actor[a:b], rollout[a:b], mask[a:b]).as_raw_metrics().items()}
        for a, b in itertools.pairwise(bounds)
    ]
    merged = {key: [rank[key] for rank in per_rank] for key in guard.RAW_KEYS}  # verl's concat: a list per rank
    folded = guard.DiffStats.from_raw_metrics(merged)
    assert folded is not None
    assert (folded.tokens, folded.sequences, folded.tail_count) == (whole.tokens, whole.sequences, whole.tail_count)
    for name, value in whole.statistics().items():
        got = folded.statistics()[name]
        assert (math.isnan(got) and math.isnan(value)) or got == pytest.approx(value, rel=1e-5, abs=1e-6), name


def test_partials_fold_over_ranks_like_one_batch() -> None:
    generator = torch.Generator().manual_seed(3)
    actor, rollout = torch.randn(8, 5, generator=generator), torch.randn(8, 5, generator=generator)
    mask = (torch.rand(8, 5, generator=generator) > 0.3).long()
    whole = guard.DiffStats.from_tensors(actor, rollout, mask)
    merged: dict[str, list[float]] = {}
    for rows in (slice(0, 3), slice(3, 8)):
        for key, value in guard.DiffStats.from_tensors(actor[rows], rollout[rows], mask[rows]).as_raw_metrics().items():
            merged.setdefault(key, []).append(value)
    folded = guard.DiffStats.from_raw_metrics(merged)
    assert folded is not None
    assert folded.tokens == whole.tokens
    assert folded.mean == pytest.approx(whole.mean)
    assert folded.abs_max == pytest.approx(whole.abs_max)
    assert folded.seq_mean_max == pytest.approx(whole.seq_mean_max)


# --- the engine's log-probs ---------------------------------------------------------------------------------------


def _sample(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    from vllm.v1.sample.sampler import Sampler

    out = Sampler()(logits.clone(), _sampling_metadata(len(logits), torch.Generator().manual_seed(5)))
    return out.sampled_token_ids[:, 0].long(), out.logprobs_tensors.logprobs[:, 0]


def test_engine_log_probs_are_those_of_the_sampling_distribution() -> None:
    logits = torch.randn(6, VOCAB, generator=torch.Generator().manual_seed(4)) * 4
    raw_tokens, raw = _sample(logits)
    assert torch.allclose(raw, torch.log_softmax(logits, -1).gather(-1, raw_tokens[:, None])[:, 0])

    apply_one(SPEC)
    tokens, processed = _sample(logits)
    assert torch.equal(tokens, raw_tokens), "sampling itself is untouched"
    expected = torch.log_softmax(logits / TEMPERATURE, -1).gather(-1, tokens[:, None])[:, 0]
    assert torch.allclose(processed, expected)
    assert not torch.allclose(processed, raw)


def test_greedy_rows_keep_raw_log_probs() -> None:
    from r1_ascend.patches.verl_rollout_guard import temperature_log_probs

    logits = torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(6))
    result = temperature_log_probs(logits, torch.tensor([0.0, 0.5]))
    assert torch.allclose(result[0], torch.log_softmax(logits[0], -1))
    assert torch.allclose(result[1], torch.log_softmax(logits[1] / 0.5, -1))
