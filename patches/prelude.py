"""Apply the overlay in this process: the only r1-ascend module with an import-time side effect.

It reaches every process that needs it:
- the driver: ``r1_ascend.recipe.main_grpo`` imports it first;
- every Ray worker: the recipe sets ``VERL_USE_EXTERNAL_MODULES=r1_ascend.patches.prelude`` in the Ray runtime
  environment, and ``import verl`` imports it in each worker (while ``verl/__init__`` is still running, so this
  module itself imports nothing heavy at top level);
- any vLLM process: the ``vllm.general_plugins`` entry point ``r1_ascend_patches`` calls ``vllm_plugin()``.

Switches: ``R1_ASCEND_DISABLE_ALL=1`` or ``R1_ASCEND_DISABLE=name1,name2``; ``R1_ASCEND_LOG_LEVEL`` sets the level of
the ``r1_ascend`` loggers (see r1_ascend.envs).
"""

from __future__ import annotations

import logging
import sys
import threading

from r1_ascend import envs

logger = logging.getLogger("r1_ascend.patches")
_lock = threading.Lock()
_done = False


def apply_once() -> None:
    """Apply all patches once per process and log one line saying what was applied."""
    global _done
    with _lock:
        if _done:
            return
        from r1_ascend.patches import PatchConfigError, apply_all, summary_line

        try:
            level = envs.configured_log_level()
        except ValueError as exc:
            raise PatchConfigError(str(exc)) from None
        if level is not None:
            logging.getLogger("r1_ascend").setLevel(level)
        results = apply_all()
        line = summary_line(results)
        logger.info(line)
        quiet = level is not None and level >= logging.ERROR
        if not quiet and not logger.isEnabledFor(logging.INFO):
            print(line, file=sys.stderr, flush=True)
        _done = True


def vllm_plugin() -> None:
    """Entry point for vLLM's ``vllm.general_plugins`` group: vLLM calls it in every process it starts."""
    apply_once()


apply_once()
