"""Fixture runs written the way verl 0.6.1 writes them.

Metrics come from verl's own functions (``compute_data_metrics``, ``compute_timing_metrics``,
``compute_throughout_metrics``, ``process_validation_metrics``) applied to a small synthetic batch; console lines are
printed by verl's ``LocalLogger``, TensorBoard files by verl's ``_TensorboardAdapter`` and generation dumps by
``RayPPOTrainer._dump_generations``. The fixture keeps the raw inputs (timings, token counts, lengths) as the
"truth" the tests compare the report against, computed without the report code.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from tqdm import tqdm

N_GPUS = 256  # 16 A3 nodes x 16 dies
BATCH = 8
PROMPT_WIDTH = 16
RESPONSE_WIDTH = 32
TRAIN_TOKENS_SEQUENCES = 8192  # 512 prompts x 16 responses, as in the target configuration
VAL_SOURCES = ("aime24", "math500")
VAL_PROBLEMS = 2
# samples per validation problem (val_kwargs.n): verl logs val-core/<set>/acc/mean@2 (its bootstrap is slow)
VAL_SAMPLES = 2
RAY_PREFIX = "\x1b[36m(TaskRunner pid=48213)\x1b[0m "
WORKER_PREFIX = "(WorkerDict pid=51007, ip=10.0.0.2) "
SURVIVED_ERROR = f"{WORKER_PREFIX}[rank3]: RuntimeError: HCCL link check timed out; retrying (attempt 1 of 3)"
WORKER_NOISE = (
    "\x1b[36m(WorkerDict pid=51007, ip=10.0.0.2)\x1b[0m INFO 11-20 08:01:02 [model_runner.py:1203] Graph capturing "
    "finished in 12 secs"
)


@dataclass
class StepTruth:
    step: int
    timing: dict[str, float]
    prompt_lengths: list[int]
    response_lengths: list[int]
    tokens: list[int]
    entropy: float
    kl_loss: float
    memory_allocated_gb: float
    sequence_scores: list[float]
    val_acc: dict[str, float] = field(default_factory=dict)


@dataclass
class FixtureRun:
    directory: Path
    log_files: list[Path]
    truth: dict[int, StepTruth]
    event_dir: Path | None = None
    dump_dir: Path | None = None
    # the error line a death left in the log, and the wrapper the driver printed around it
    error_line: str | None = None
    error_wrapper: str | None = None


@pytest.fixture(scope="session")
def verl_modules() -> SimpleNamespace:
    import verl.trainer.ppo.ray_trainer as ray_trainer
    from verl import DataProto
    from verl.trainer.ppo import metric_utils
    from verl.utils.debug.metrics import calculate_debug_metrics
    from verl.utils.logger import LocalLogger
    from verl.utils.tracking import _TensorboardAdapter

    return SimpleNamespace(
        DataProto=DataProto,
        metric_utils=metric_utils,
        LocalLogger=LocalLogger,
        TensorboardAdapter=_TensorboardAdapter,
        dump_generations=ray_trainer.RayPPOTrainer._dump_generations,
        RayPPOTrainer=ray_trainer.RayPPOTrainer,
        debug_metrics=calculate_debug_metrics,
    )


def _batch(verl: SimpleNamespace, rng: np.random.Generator) -> tuple[object, list[int], list[int], list[float]]:
    import torch

    prompt_lengths = rng.integers(4, PROMPT_WIDTH + 1, size=BATCH)
    response_lengths = rng.integers(1, RESPONSE_WIDTH + 1, size=BATCH)
    prompt_mask = torch.tensor([[0] * (PROMPT_WIDTH - n) + [1] * n for n in prompt_lengths])
    response_mask = torch.tensor([[1] * n + [0] * (RESPONSE_WIDTH - n) for n in response_lengths])
    scores = rng.choice([0.0, 1.0], size=BATCH)
    token_scores = torch.zeros(BATCH, RESPONSE_WIDTH)
    for row, (n, score) in enumerate(zip(response_lengths, scores, strict=True)):
        token_scores[row, n - 1] = float(score)
    advantages = torch.tensor(rng.normal(size=(BATCH, RESPONSE_WIDTH)), dtype=torch.float32) * response_mask
    batch = verl.DataProto.from_dict(
        tensors={
            "responses": torch.zeros(BATCH, RESPONSE_WIDTH, dtype=torch.long),
            "attention_mask": torch.cat([prompt_mask, response_mask], dim=1),
            "response_mask": response_mask,
            "token_level_scores": token_scores,
            "token_level_rewards": token_scores.clone(),
            "advantages": advantages,
            "returns": advantages.clone(),
        }
    )
    return batch, [int(n) for n in prompt_lengths], [int(n) for n in response_lengths], [float(s) for s in scores]


#: Expert-parallel ranks of the fixture's MoE actor.
EXPERT_PARALLEL = 4

#: The guard levels the fixture's runs log (the mean's; the other statistics keep the defaults).
GUARD_WARN, GUARD_STOP = 0.4, 0.8
#: The calibrated baseline the fixture's runs log for every gated statistic.
GUARD_BASELINE = 0.05


def _consistency_metrics(
    verl: SimpleNamespace, batch: object, rng: np.random.Generator, drift: float
) -> dict[str, float]:
    """verl's rollout-vs-actor debug metrics, plus the overlay guard's metrics as its driver logs them."""
    import torch

    from r1_ascend.patches.rules import rollout_guard as guard

    mask = batch.batch["response_mask"].bool()
    actor = -torch.tensor(np.abs(rng.normal(size=tuple(mask.shape))), dtype=torch.float32)
    rollout = actor + torch.tensor(rng.normal(scale=drift, size=tuple(mask.shape)), dtype=torch.float32)
    batch.batch["old_log_probs"] = actor
    batch.batch["rollout_log_probs"] = rollout
    metrics = verl.debug_metrics(batch)
    levels = guard.Levels(  # a run's calibrated levels, with the baseline they were set from
        warn={**guard.DEFAULT_WARN, "abs_diff_mean": GUARD_WARN},
        stop={**guard.DEFAULT_STOP, "abs_diff_mean": GUARD_STOP},
        baseline=dict.fromkeys(guard.GATED, GUARD_BASELINE),
        reference=dict.fromkeys(guard.GATED, GUARD_BASELINE),
        over=(1, 2, 3),
    )
    stats = guard.DiffStats.from_tensors(actor, rollout, mask)
    metrics.update(guard.metrics(stats, guard.Verdict.judge(stats, levels), in_update=False))
    return metrics


class _ValidationEngine:
    """Stands in for generation and the reward at verl's worker-group / reward-function boundary.

    ``RayPPOTrainer._validate`` itself runs: it repeats each problem ``val_kwargs.n`` times, pads for the worker
    group, calls ``generate_sequences`` and the reward function, then names the metrics (``val-core`` /
    ``val-aux``) through ``process_validation_metrics``.
    """

    world_size = 1

    def __init__(self, verl: SimpleNamespace, rng: np.random.Generator) -> None:
        self.verl = verl
        self.rng = rng
        self.acc: dict[str, list[float]] = {source: [] for source in VAL_SOURCES}

    def generate_sequences(self, batch):
        import torch

        size = len(batch.batch)
        return self.verl.DataProto.from_dict(tensors={"responses": torch.ones(size, 4, dtype=torch.long)})

    def reward(self, batch, return_dict: bool = True) -> dict[str, object]:
        import torch

        sources = list(batch.non_tensor_batch["data_source"])
        acc = [float(self.rng.random() < 0.4) for _ in sources]
        fmt = [float(self.rng.random() < 0.8) for _ in sources]
        for source, value in zip(sources, acc, strict=True):
            self.acc[source].append(value)
        scores = torch.zeros(len(sources), 4)
        scores[:, -1] = torch.tensor(acc)
        extra = {"acc": acc, "format": fmt, "pred": [str(int(a)) for a in acc]}
        return {"reward_tensor": scores, "reward_extra_info": extra}


def _validation_metrics(
    verl: SimpleNamespace, rng: np.random.Generator, step: int
) -> tuple[dict[str, float], dict[str, float]]:
    """Metrics from verl's own ``RayPPOTrainer._validate`` (VAL_SAMPLES samples per problem); truth: mean accuracy."""
    import torch
    from omegaconf import OmegaConf

    engine = _ValidationEngine(verl, rng)
    problems = [(source, index) for source in VAL_SOURCES for index in range(VAL_PROBLEMS)]
    batch = {
        "input_ids": torch.ones(len(problems), 6, dtype=torch.long),
        "attention_mask": torch.ones(len(problems), 6, dtype=torch.long),
        "position_ids": torch.arange(6).repeat(len(problems), 1),
        "data_source": np.array([source for source, _ in problems], dtype=object),
        "reward_model": np.array([{"style": "rule", "ground_truth": "1"} for _ in problems], dtype=object),
    }
    config = OmegaConf.create(
        {
            "actor_rollout_ref": {"rollout": {"val_kwargs": {"n": VAL_SAMPLES, "do_sample": True}}},
            "reward_model": {"enable": False},
            "trainer": {"log_val_generations": 0, "validation_data_dir": None},
        }
    )
    owner = SimpleNamespace(
        config=config,
        val_dataloader=[batch],
        tokenizer=SimpleNamespace(decode=lambda ids, skip_special_tokens=True: "x", eos_token_id=2, pad_token_id=0),
        actor_rollout_wg=engine,
        async_rollout_mode=False,
        val_reward_fn=engine.reward,
        global_steps=step,
    )
    owner._get_gen_batch = partial(verl.RayPPOTrainer._get_gen_batch, owner)
    owner._maybe_log_val_generations = partial(verl.RayPPOTrainer._maybe_log_val_generations, owner)
    with contextlib.redirect_stdout(io.StringIO()):
        metrics = verl.RayPPOTrainer._validate(owner)
    return metrics, {source: float(np.mean(values)) for source, values in engine.acc.items()}


def _step_metrics(
    verl: SimpleNamespace,
    step: int,
    rng: np.random.Generator,
    token_scale: float,
    val: bool,
    reshard_timer: bool,
    stage_scale: dict[str, float],
    log_prob_drift: float | None = None,
    expert_tokens: dict[int, list[float]] | None = None,
) -> tuple[dict[str, float], StepTruth]:
    batch, prompt_lengths, response_lengths, scores = _batch(verl, rng)
    consistency = _consistency_metrics(verl, batch, rng, log_prob_drift) if log_prob_drift is not None else {}
    gen_core = float(rng.uniform(400, 480))
    timing = {
        "start_profile": 1e-5,
        "gen": gen_core + float(rng.uniform(40, 80)),
        "generate_sequences": gen_core,
        "generation_timing/max": gen_core * 1.02,
        "generation_timing/min": gen_core * 0.97,
        "generation_timing/topk_ratio": 0.4,
        "reward": float(rng.uniform(5, 12)),
        "old_log_prob": float(rng.uniform(120, 140)),
        "ref": float(rng.uniform(100, 120)),
        "adv": float(rng.uniform(0.5, 1.5)),
        "update_actor": float(rng.uniform(450, 520)),
    }
    if reshard_timer:
        timing["reshard"] = float(rng.uniform(10, 20))
    if val:
        timing["testing"] = float(rng.uniform(60, 90))
    timing["stop_profile"] = 1e-5
    # a slower stage (the same random draws, so everything else matches a run without the slowdown)
    for name, scale in stage_scale.items():
        if name == "reshard" and "reshard" not in timing:  # no timer: the part of gen outside generate_sequences
            timing["gen"] += (scale - 1.0) * (timing["gen"] - gen_core)
        else:
            timing[name] *= scale
    if "generate_sequences" in stage_scale:
        timing["gen"] += timing["generate_sequences"] - gen_core
    top_level = ("gen", "reward", "old_log_prob", "ref", "adv", "update_actor", "testing")
    timing["step"] = sum(timing.get(name, 0.0) for name in top_level) + float(rng.uniform(1, 5))
    per_seq = rng.integers(1800, 3400, size=TRAIN_TOKENS_SEQUENCES)
    tokens = [round(float(n) * token_scale) for n in per_seq]
    batch.meta_info["global_token_num"] = tokens

    entropy = float(rng.uniform(0.3, 0.6))
    kl_loss = float(rng.uniform(1e-4, 3e-3))
    memory = float(rng.uniform(50, 56))
    metrics: dict[str, float] = {
        "actor/entropy": entropy,
        "actor/pg_loss": float(rng.normal()),
        "actor/pg_clipfrac": 0.0,
        "actor/ppo_kl": 0.0,
        "actor/kl_loss": kl_loss,
        "actor/kl_coef": 0.001,
        "actor/grad_norm": float(rng.uniform(0.1, 1.0)),
        "perf/max_memory_allocated_gb": memory,
        "perf/max_memory_reserved_gb": memory + 2.0,
        "perf/cpu_memory_used_gb": 812.5,
        "actor/lr": 1e-06,
    }
    truth = StepTruth(step, dict(timing), prompt_lengths, response_lengths, tokens, entropy, kl_loss, memory, scores)
    if val:
        val_metrics, truth.val_acc = _validation_metrics(verl, rng, step)
        metrics.update(val_metrics)
    metrics.update(consistency)
    if expert_tokens is not None:  # what patch verl_moe_expert_load adds to the actor's metrics
        from r1_ascend.patches.rules import expert_load

        metrics.update(expert_load.step_metrics(expert_tokens, EXPERT_PARALLEL))
    metrics.update({"training/global_step": step, "training/epoch": 0})
    metrics.update(verl.metric_utils.compute_data_metrics(batch=batch, use_critic=False))
    metrics.update(verl.metric_utils.compute_timing_metrics(batch=batch, timing_raw=timing))
    metrics.update(verl.metric_utils.compute_throughout_metrics(batch=batch, timing_raw=timing, n_gpus=N_GPUS))
    return metrics, truth


def _console_lines(verl: SimpleNamespace, metrics: dict[str, float], step: int) -> str:
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        verl.LocalLogger(print_to_console=True).log(data=metrics, step=step)
    return buffer.getvalue()


def _drain(buffer: io.StringIO) -> str:
    """What tqdm wrote since the last call, as Ray forwards it: one prefixed line."""
    text = buffer.getvalue()
    buffer.seek(0)
    buffer.truncate()
    return f"{RAY_PREFIX}{text.rstrip(chr(10))}\n" if text else ""


def _ray_error_tracebacks() -> tuple[str, str, str, str]:
    """A real verl error inside a worker, and the driver's traceback after Ray re-raised it (ray.get in run_ppo).

    Returns the worker's traceback text, the driver's, the root-cause line and the wrapper line.
    """
    import traceback

    import torch
    from ray.exceptions import RayTaskError
    from verl.trainer.ppo.core_algos import agg_loss

    try:
        agg_loss(loss_mat=torch.zeros(2, 3), loss_mask=torch.ones(2, 3), loss_agg_mode="token-mean-per-die")
    except ValueError as exc:
        cause = exc
        worker_traceback = "".join(traceback.format_exception(exc))
    ray_error = RayTaskError(
        "TaskRunner.run", worker_traceback, cause, proctitle="ray::TaskRunner.run", pid=48213, ip="10.0.0.1"
    ).as_instanceof_cause()

    def run_ppo() -> None:  # the driver's ray.get(runner.run.remote(config)) raising the worker's error
        raise ray_error

    try:
        run_ppo()
    except Exception as exc:
        driver_traceback = "".join(traceback.format_exception(exc, chain=False))
    lines = [line for line in driver_traceback.splitlines() if line and not line[0].isspace()]
    wrapper = re.sub(r"\x1b\[[0-9;]*m", "", next(line for line in lines if line.startswith("ray.exceptions.RayTask")))
    root = worker_traceback.rstrip().splitlines()[-1]
    return worker_traceback, driver_traceback, root, wrapper


@contextlib.contextmanager
def _tensorboard_dir(path: Path):
    old = os.environ.get("TENSORBOARD_DIR")
    os.environ["TENSORBOARD_DIR"] = str(path)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TENSORBOARD_DIR", None)
        else:
            os.environ["TENSORBOARD_DIR"] = old


class RunWriter:
    """Writes one fixture run segment by segment (a segment = one process lifetime, e.g. before a crash)."""

    def __init__(self, verl: SimpleNamespace, directory: Path, seed: int, token_scale: float = 1.0) -> None:
        self.verl = verl
        self.directory = directory
        self.rng = np.random.default_rng(seed)
        self.token_scale = token_scale
        self.run = FixtureRun(directory=directory, log_files=[], truth={})
        directory.mkdir(parents=True, exist_ok=True)

    def segment(
        self,
        steps: range,
        log_name: str = "train.log",
        tensorboard: bool = False,
        dumps: bool = False,
        test_freq: int = 5,
        val_before_train_step: int | None = None,
        resumed_from: int | None = None,
        reshard_timer: bool = False,
        noise: bool = True,
        planned: int | None = None,
        announce_planned: bool = True,
        death: str | None = None,
        ray_prefixed_traceback: bool = False,
        stage_scale: dict[str, float] | None = None,
        log_prob_drift: Callable[[int], float] | None = None,
        expert_tokens: Callable[[int], dict[int, list[float]]] | None = None,
    ) -> None:
        """``planned``: verl's total_training_steps (default: the segment's last step); ``death``: None, "error"
        (a verl exception re-raised through Ray, as the driver prints it) or "kill" (the log just stops mid-step)."""
        verl = self.verl
        planned = steps[-1] if planned is None else planned
        text = [f"{RAY_PREFIX}Using dataset class: RLHFDataset\n"]
        if announce_planned:
            text.append(f"{RAY_PREFIX}Total training steps: {planned}\n")
        adapter = None
        if tensorboard:
            self.run.event_dir = self.directory / "tensorboard_log"
            with _tensorboard_dir(self.run.event_dir), contextlib.redirect_stdout(io.StringIO()):
                adapter = verl.TensorboardAdapter("r1_ascend", "fixture")
        if resumed_from is not None:
            text.append(f"{RAY_PREFIX}Load from checkpoint folder: checkpoints/global_step_{resumed_from}\n")
            text.append(f"{RAY_PREFIX}Setting global step to {resumed_from}\n")
            text.append(f"{RAY_PREFIX}Resuming from checkpoints/global_step_{resumed_from}\n")
        if val_before_train_step is not None:
            val_metrics, val_truth = _validation_metrics(verl, self.rng, val_before_train_step)
            text += [
                RAY_PREFIX + line + "\n"
                for line in _console_lines(verl, val_metrics, val_before_train_step).split("\n")
                if line
            ]
            self.run.truth.setdefault(
                val_before_train_step, StepTruth(val_before_train_step, {}, [], [], [], 0, 0, 0, [])
            )
            self.run.truth[val_before_train_step].val_acc = val_truth
            if adapter:
                adapter.log(data=val_metrics, step=val_before_train_step)
        # verl's own progress bar: tqdm(total=total_training_steps, initial=global_steps), updated after each log
        bar_output = io.StringIO()
        bar = tqdm(
            total=planned, initial=steps[0] - 1, desc="Training Progress", file=bar_output, mininterval=0, ascii=True
        )
        text.append(_drain(bar_output))
        for step in steps:
            metrics, truth = _step_metrics(
                verl,
                step,
                self.rng,
                self.token_scale,
                val=step % test_freq == 0,
                reshard_timer=reshard_timer,
                stage_scale=stage_scale or {},
                log_prob_drift=None if log_prob_drift is None else log_prob_drift(step),
                expert_tokens=None if expert_tokens is None else expert_tokens(step),
            )
            self.run.truth[step] = truth
            if noise:
                text.append(WORKER_NOISE + "\n")
            if death is not None and step == steps[-1]:
                # dies inside this step: its metrics line is never printed
                del self.run.truth[step]
                text.append(self._death_text(death, ray_prefixed_traceback))
                break
            text += [RAY_PREFIX + line + "\n" for line in _console_lines(verl, metrics, step).split("\n") if line]
            bar.update(1)
            text.append(_drain(bar_output))
            if adapter:
                adapter.log(data=metrics, step=step)
            if dumps:
                self._dump(step, truth)
            if step == steps[0] and death is not None:
                text.append(SURVIVED_ERROR + "\n")  # an error the run lives through is not its cause of death
        if adapter:
            adapter.finish()
        path = self.directory / log_name
        with path.open("a", encoding="utf-8") as handle:
            handle.write("".join(text))
        if path not in self.run.log_files:
            self.run.log_files.append(path)

    def _death_text(self, death: str, ray_prefixed: bool) -> str:
        if death == "kill":
            return f"{RAY_PREFIX}test_gen_batch meta info: {{'validate': False}}\n{WORKER_NOISE}"
        worker_traceback, driver_traceback, root, wrapper = _ray_error_tracebacks()
        self.run.error_line, self.run.error_wrapper = root, wrapper
        if ray_prefixed:  # the worker printed its own traceback, which Ray forwards with its prefix
            worker = "".join(f"{WORKER_PREFIX}{line}\n" for line in worker_traceback.splitlines())
            return worker + f"{WORKER_NOISE}\n" + driver_traceback
        return "Error executing job with overrides: ['trainer.total_training_steps=100']\n" + driver_traceback

    def _dump(self, step: int, truth: StepTruth) -> None:
        self.run.dump_dir = self.directory / "rollout_data"
        n = len(truth.sequence_scores)
        owner = SimpleNamespace(global_steps=step)
        extra = {  # the keys this recipe's reward returns, including its two text fields
            "acc": [bool(s) for s in truth.sequence_scores],
            "format": [float(i % 2 == 0) for i in range(n)],
            "pred": [str(i + step) for i in range(n)],
            "fail_reason": ["" if s else "wrong_answer" for s in truth.sequence_scores],
        }
        with contextlib.redirect_stdout(io.StringIO()):
            self.verl.dump_generations(
                owner,
                inputs=[f"Problem {step}.{i}: what is {i} + {step}?" for i in range(n)],
                outputs=[f"<think>add</think> The answer is \\boxed{{{i + step}}}" for i in range(n)],
                gts=[str(i + step) for i in range(n)],
                scores=truth.sequence_scores,
                reward_extra_infos_dict=extra,
                dump_path=str(self.run.dump_dir),
            )


@pytest.fixture
def run_writer(verl_modules: SimpleNamespace, tmp_path: Path) -> Callable[..., RunWriter]:
    def make(name: str = "run", seed: int = 0, token_scale: float = 1.0) -> RunWriter:
        return RunWriter(verl_modules, tmp_path / name, seed, token_scale)

    return make


@pytest.fixture(scope="module")
def module_run_writer(
    verl_modules: SimpleNamespace, tmp_path_factory: pytest.TempPathFactory
) -> Callable[..., RunWriter]:
    """``run_writer`` for runs a whole module only reads (a run through verl's logger takes seconds to write)."""
    root = tmp_path_factory.mktemp("runs")

    def make(name: str = "run", seed: int = 0, token_scale: float = 1.0) -> RunWriter:
        return RunWriter(verl_modules, root / name, seed, token_scale)

    return make
