"""Refuse a rollout engine whose model configuration differs from the actor's, when the engine is built.

Target:
verl.workers.megatron_workers.ActorRolloutRefWorker.trainer_mode (wrapped: before the stock body, on a worker that
holds both the actor's HF config and the rollout engine, the engine's model configuration is compared with the
actor's field by field). verl calls it at the end of ``_build_rollout`` (sync mode), so the first comparison is
at the engine's build, before the first weight sync; it runs again after every generation.

Upstream:
verl 0.6.1 (``ActorRolloutRefWorker._build_rollout`` ends with ``trainer_mode()`` in sync mode; ``MegatronWorker.
_init_hf_config_and_tf_config`` keeps the actor's config as ``self.hf_config``, from ``model.path`` and
``model.override_config.model_config``); vllm 0.9.1 (``LLM.llm_engine.model_config.hf_config``: the config read
from the model directory with ``hf_overrides`` applied, which the engine builds its model from).

Process:
worker (the Ray worker colocating the Megatron actor and the vLLM rollout).

Why:
The actor and the rollout read their model configurations separately: verl's worker from ``model.path`` plus
``override_config.model_config``, vLLM again from the directory plus ``engine_kwargs.vllm.hf_overrides`` and its
own config handling. A field that differs (yarn's ``rope_scaling``, group-limited routing's ``n_group`` /
``topk_group``, ``routed_scaling_factor``, ``scoring_func``, ...) makes the two compute different models: the
rollout samples from one policy and the actor trains another. The log-prob guard sees that only as a gap: on the
CPU rehearsal's model ungrouped routing moves the median |Δ log-prob| by 10x its healthy level, and yarn switched
off at 50-token positions not at all (docs/rollout_guard.md). Equality of the fields is exact and costs nothing.

How:
both configs' ``to_dict()`` are compared by ``rules.model_config``: every field of either, except the generic
``PretrainedConfig`` fields every config has (output switches, generation defaults, label maps; but
``tie_word_embeddings`` is compared) and the few that name or initialise a model (``architectures``, token ids,
``initializer_range``, ...), with ``rope_scaling``'s legacy ``type`` read as ``rope_type``. Any difference raises
``RolloutModelConfigError`` naming each field and both values, and where to fix it; the first match logs one line.
A worker without an actor (rollout-only, reference) or without a built rollout is left alone; a rollout engine with
no ``llm_engine.model_config.hf_config`` (the engine's layout moved) raises ``PatchTargetError``.

Upstream fix:
none — verl 0.6.1 and main as of b178a3cd (2026-01-29) never compare the rollout engine's model config with the
actor's.

Remove when:
verl checks at rollout build that the inference engine's model config equals the training model's (fields that
change the forward pass) and refuses a difference; then delete this module, its registry entry,
rules/model_config.py and tests/patches/test_verl_rollout_model_config.py.

Disable:
R1_ASCEND_DISABLE=verl_rollout_model_config — no comparison: an engine configured differently from the actor runs,
and only the log-prob guard's statistics can show it.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from ._errors import PatchTargetError, RolloutModelConfigError
from ._install import install_on_import
from ._registry import PatchSpec, spec_by_module
from ._target import disable_hint
from .rules import model_config

logger = logging.getLogger(__name__)

#: This patch's registry name (the R1_ASCEND_DISABLE token).
NAME = spec_by_module(__name__).name
#: Where vLLM 0.9.1's ``LLM`` holds the model config it built the model from.
ENGINE_CONFIG_PATH = "llm_engine.model_config.hf_config"


def apply(spec: PatchSpec) -> None:
    install_on_import(spec.name, spec.target("ActorRolloutRefWorker.trainer_mode"), _build_trainer_mode)


def _build_trainer_mode(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def trainer_mode(self: Any) -> Any:
        check_worker(self)
        return await original(self)

    return trainer_mode


def check_worker(worker: Any) -> None:
    """Compare the worker's rollout engine with its actor (nothing to compare without both)."""
    actor = getattr(worker, "hf_config", None)
    rollout = getattr(worker, "rollout", None)
    if actor is None or rollout is None or not getattr(worker, "_is_actor", False):
        return
    engine = engine_config(rollout)
    check_configs(actor, engine)
    if not getattr(worker, "_r1_model_config_checked", False):
        worker._r1_model_config_checked = True
        logger.info("patch %s: the rollout engine's model configuration equals the actor's", NAME)


def engine_config(rollout: Any) -> Any:
    """The HF config the rollout's vLLM engine built its model from."""
    found: Any = getattr(rollout, "inference_engine", None)
    for part in ENGINE_CONFIG_PATH.split("."):
        found = getattr(found, part, None)
    if found is None or not hasattr(found, "to_dict"):
        msg = (
            f"patch {NAME!r}: the rollout {type(rollout).__name__} has no inference_engine.{ENGINE_CONFIG_PATH} "
            f"(vLLM 0.9.1's LLM keeps the model config there), so its model configuration cannot be compared with "
            f"the actor's. {disable_hint(NAME)}"
        )
        raise PatchTargetError(msg)
    return found


def check_configs(actor: Any, engine: Any) -> None:
    """Raise ``RolloutModelConfigError`` when two HF configs differ in a field that changes the forward pass."""
    from transformers import PretrainedConfig

    generic = PretrainedConfig().to_dict()
    found = model_config.differences(
        model_config.comparable(actor.to_dict(), generic), model_config.comparable(engine.to_dict(), generic)
    )
    if found:
        message = model_config.mismatch_message(
            found, engine=_named(engine, "vLLM's model_config.hf_config"), actor=_named(actor, "the worker's hf_config")
        )
        raise RolloutModelConfigError(f"patch {NAME}: {message}")


def _named(config: Any, what: str) -> str:
    path = getattr(config, "_name_or_path", "")
    return f"{what}, {type(config).__name__} from {path}" if path else f"{what}, {type(config).__name__}"
