"""The rollout engine must compute the actor's model: the two HF model configurations, field by field.

The actor (verl's Megatron worker) builds its model from its HF config; vLLM builds the rollout's from its own, read
again from the model directory and changed by whatever the engine applies (``engine_kwargs.vllm.hf_overrides``,
vLLM's or vllm-ascend's own config handling). A field that differs makes the two engines compute different models
(yarn's rope scaling, group-limited routing's ``n_group`` / ``topk_group``, ``routed_scaling_factor``,
``scoring_func``, ...), which the log-prob guard can only see as a gap, and at short positions or on a small model
not at all. So every field that can enter the forward pass is compared: all fields of either config except the
generic ``PretrainedConfig`` ones (output switches, generation defaults, label maps: ``generic_fields``) and a few
that name or initialise the model rather than compute it (``NOT_COMPUTED``). Pure: the caller passes plain
``to_dict()`` mappings.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["ABSENT", "KEPT_GENERIC", "NOT_COMPUTED", "Difference", "comparable", "differences", "mismatch_message"]

#: Fields that name, type or initialise a model, or set token ids verl overrides from the tokenizer on one side only;
#: none changes what the forward pass computes from given weights.
NOT_COMPUTED = frozenset(
    {
        "_name_or_path",
        "architectures",
        "auto_map",
        "torch_dtype",
        "transformers_version",
        "use_cache",
        "initializer_range",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "attn_implementation",
        "_attn_implementation_autoset",
        "model_type",  # the architecture itself; different types fail earlier and differ in every other field
    }
)
#: Generic ``PretrainedConfig`` fields that do change the forward pass, compared although every config has them.
KEPT_GENERIC = frozenset({"tie_word_embeddings"})
#: Shown for a field one config does not have.
ABSENT = "(absent)"


@dataclass(frozen=True)
class Difference:
    field: str
    actor: Any
    engine: Any


def comparable(config: Mapping[str, Any], generic: Iterable[str]) -> dict[str, Any]:
    """``config`` (a ``to_dict()``) without the ``generic`` fields of every ``PretrainedConfig`` (except
    ``KEPT_GENERIC``) and ``NOT_COMPUTED``, rope scaling in one spelling."""
    skipped = (set(generic) - KEPT_GENERIC) | NOT_COMPUTED
    return {key: _normalised(key, value) for key, value in config.items() if key not in skipped}


def _normalised(key: str, value: Any) -> Any:
    """``rope_scaling``'s legacy ``type`` is its ``rope_type`` (transformers and vLLM both read it so)."""
    if key == "rope_scaling" and isinstance(value, Mapping):
        scaling = dict(value)
        legacy = scaling.pop("type", None)
        if legacy is not None:
            scaling.setdefault("rope_type", legacy)
        return scaling
    return value


def differences(actor: Mapping[str, Any], engine: Mapping[str, Any]) -> list[Difference]:
    """The fields of two ``comparable`` configs whose values differ, or that only one has, in sorted order."""
    found = []
    for key in sorted(set(actor) | set(engine)):
        mine, theirs = actor.get(key, ABSENT), engine.get(key, ABSENT)
        if not _equal(mine, theirs):
            found.append(Difference(key, mine, theirs))
    return found


def _equal(a: Any, b: Any) -> bool:
    """Equal values; numbers compare by value (JSON's 10000 and 10000.0 are one rope_theta)."""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return set(a) == set(b) and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(map(_equal, a, b))
    return (type(a) is type(b) and a == b) or (_numbers(a, b) and float(a) == float(b))


def _numbers(a: Any, b: Any) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (a, b))


def mismatch_message(found: list[Difference], *, engine: str, actor: str) -> str:
    """The error for a rollout engine whose model config differs from the actor's (``found`` not empty)."""
    shown = "; ".join(f"{d.field}: actor {d.actor!r}, rollout engine {d.engine!r}" for d in found)
    return (
        f"the rollout engine's model configuration ({engine}) differs from the actor's ({actor}) in "
        f"{len(found)} field(s) that change what the model computes: {shown}. The two would sample and score with "
        "different models, and the log-prob guard would see only a gap (none at all where the field does not act, "
        "e.g. yarn at short positions). Make both read the same config: remove the field from "
        "actor_rollout_ref.rollout.engine_kwargs.vllm.hf_overrides, or set it the same way for the actor under "
        "actor_rollout_ref.model.override_config.model_config (docs/rollout_guard.md, 'The engine's model "
        "configuration')."
    )
