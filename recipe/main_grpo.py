"""Entry point of the GRPO recipe: ``python -m r1_ascend.recipe.main_grpo --config-path DIR --config-name NAME``.

It applies the overlay in this process first, makes sure every Ray worker applies it too (through
``VERL_USE_EXTERNAL_MODULES`` in the Ray runtime env), refuses configurations under which verl would quietly run its
stock workers, and then hands over to verl 0.6.1's own ``run_ppo`` with a ``TaskRunner`` subclass — verl's
driver logic is reused, not copied.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import hydra
from omegaconf import OmegaConf, open_dict
from verl.trainer.main_ppo import TaskRunner, run_ppo

import r1_ascend.patches.prelude  # noqa: F401 - applies the overlay before any verl object is built or used
from r1_ascend.patches import WorkerLostError
from r1_ascend.patches.rules.watchdog import Beat, WatchdogConfig
from r1_ascend.recipe import diagnosis, watchdog
from r1_ascend.recipe.checks import check_recipe_config
from r1_ascend.recipe.driver_address import check_driver_can_join
from r1_ascend.recipe.reward_file import resolve_in_config
from r1_ascend.recipe.runtime_env import add_overlay_to_config

logger = logging.getLogger(__name__)

#: The resource Ray gives the head node only (one unit; a fraction of it pins an actor there without using it up).
HEAD_NODE_RESOURCE = "node:__internal_head__"
#: The packaged recipe configs; ``--config-path`` overrides it.
CONFIG_DIR = str(Path(__file__).resolve().parent / "config")


class RecipeConfigError(ValueError):
    """The configuration would run stock verl instead of the overlay."""


def raise_on_problems(problems: list[str]) -> None:
    if problems:
        listed = "\n".join(f"  - {problem}" for problem in problems)
        msg = f"r1-ascend refuses to start: the run would not use the overlay's code paths:\n{listed}"
        raise RecipeConfigError(msg)


def prepare_config(config: Any) -> Any:
    """Set what the overlay needs where the user left it unset, and carry the overlay into Ray's runtime env."""
    with open_dict(config):
        if OmegaConf.select(config, "actor_rollout_ref.rollout.mode", default=None) is None:
            OmegaConf.update(config, "actor_rollout_ref.rollout.mode", "sync", force_add=True)
        resolve_in_config(config)  # verl loads the reward by file path: the installed module's file
    add_overlay_to_config(config)
    return config


class R1AscendTaskRunner(TaskRunner):
    """verl's TaskRunner, checking in the driver process (where the trainer is built) that the overlay is live."""

    def run(self, config: Any) -> None:
        raise_on_problems(check_recipe_config(config))
        check_resume_before_workers(config)
        with watchdog.watching(config) as dog:
            try:
                super().run(config)
            except Exception as exc:
                raise_if_worker_lost(exc, dog, config)
                raise

    def add_actor_rollout_worker(self, config: Any) -> tuple[type, type]:
        from verl.workers.megatron_workers import ActorRolloutRefWorker

        worker_cls, group_cls = super().add_actor_rollout_worker(config)
        if worker_cls is not ActorRolloutRefWorker:
            msg = (
                f"verl chose {worker_cls.__module__}.{worker_cls.__qualname__}; the overlay patches "
                "verl.workers.megatron_workers.ActorRolloutRefWorker (strategy=megatron, rollout.mode=sync)"
            )
            raise RecipeConfigError(msg)
        return worker_cls, group_cls


def check_resume_before_workers(config: Any) -> None:
    """The resume check of patch ``verl_checkpoint_integrity``, before verl builds the workers (a minute at rehearsal
    size, far more on the cluster) rather than inside ``_load_checkpoint`` after them: a broken checkpoint stops the
    launch in seconds. It runs here, in the TaskRunner, because that is where verl resolves ``default_local_dir``."""
    from r1_ascend.patches import verl_checkpoint_integrity as integrity
    from r1_ascend.patches.rules.switches import read_switches

    if read_switches().enabled(integrity.NAME):
        integrity.check_resume(config.trainer)


def raise_if_worker_lost(exc: Exception, dog: watchdog.Watchdog | None, config: Any) -> None:
    """Turn the trainer's failure into WorkerLostError when a worker was lost or stuck (else return)."""
    found = watchdog.lost_workers(exc, dog)
    if found is None:
        return
    stall, lost = found
    beats = dog.beats if dog is not None else []
    raise WorkerLostError(diagnosis.trainer_message(exc, beats, stall, lost, checkpoint_root(config))) from exc


def checkpoint_root(config: Any) -> Path:
    """Where the run's checkpoints are, as patch verl_checkpoint_integrity (and verl) resolve it."""
    from r1_ascend.patches import verl_checkpoint_integrity as integrity

    return integrity.checkpoint_root(config.trainer)


def run(config: Any) -> None:
    import ray

    prepare_config(config)
    raise_on_problems(check_recipe_config(config))
    if not ray.is_initialized():
        check_driver_can_join()  # run_ppo's bare ray.init() would otherwise start a local cluster
    recorder = diagnosis.BeatRecorder(WatchdogConfig.from_config(config).poll_s).start()
    try:
        run_ppo(config, task_runner_class=task_runner_class())
    except Exception as exc:
        message = lost_run_message(exc, config, recorder.beats)
        if message is None:
            raise
        print(f"r1-ascend: WorkerLostError: {message}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    finally:
        recorder.stop()


def lost_run_message(exc: Exception, config: Any, beats: list[Beat] | None = None) -> str | None:
    """The one line the driver prints when the run stopped for a lost worker (the TaskRunner's WorkerLostError,
    whose Ray copy carries its traceback), or for the lost TaskRunner itself, diagnosed from Ray's errors, Ray's
    node table and the driver's copy of the workers' last heartbeats (``beats``); None for any other error."""
    if isinstance(exc, WorkerLostError):
        return str(getattr(exc, "cause", None) or exc)
    return diagnosis.driver_message(exc, beats or [], checkpoint_root(config))


def task_runner_class() -> Any:
    """The TaskRunner as a Ray actor on the head node, where the driver runs: verl places it on any node with a
    free CPU, and a worker node lost would take the trainer (and the watchdog) with it instead of being reported."""
    import ray

    return ray.remote(num_cpus=1, resources={HEAD_NODE_RESOURCE: 0.001})(R1AscendTaskRunner)


@hydra.main(config_path=CONFIG_DIR, config_name=None, version_base=None)
def main(config: Any) -> None:
    run(config)


if __name__ == "__main__":
    main()
