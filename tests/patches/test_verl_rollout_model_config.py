"""verl_rollout_model_config: a rollout engine built with a model configuration other than the actor's is refused when
verl switches the worker to trainer mode at the end of the rollout's build, naming the field and both values.

Real: verl 0.6.1's ``ActorRolloutRefWorker.trainer_mode`` (the patched target, its stock body run after the check),
transformers' configs read from the rehearsal's tiny DeepSeek-V3 directory, the rehearsal's rollout engine
(``CPUStandInLLM``, which applies ``hf_overrides`` as vLLM 0.9.1's ``ModelConfig`` does and keeps the result where
vLLM's ``LLM`` does), the planted engine-configuration faults of ``r1_ascend.rehearse.rollout_faults``. Stand-ins:
the worker object (its actor config, rollout and the device calls of trainer mode).
"""

from __future__ import annotations

import asyncio
import json
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoConfig

from r1_ascend.cpu.engine import CPUStandInLLM
from r1_ascend.patches import (
    PatchTargetError,
    RolloutModelConfigError,
    apply_one,
    forget_applied,
    restore_all,
    spec_by_name,
)
from r1_ascend.patches.rules import model_config as rule
from r1_ascend.rehearse import rollout_faults
from r1_ascend.rehearse.inputs import write_model

SPEC = spec_by_name("verl_rollout_model_config")
ENGINE_FAULTS = sorted(name for name, fault in rollout_faults.FAULTS.items() if fault.engine_overrides is not None)


# --- the rule, on plain mappings ---------------------------------------------------------------------------------


GENERIC = {"return_dict": True, "tie_word_embeddings": True, "output_attentions": False}


def test_generic_and_naming_fields_are_not_compared_but_tied_embeddings_are() -> None:
    config = {**GENERIC, "architectures": ["X"], "bos_token_id": 0, "initializer_range": 0.02, "n_group": 8}
    assert rule.comparable(config, GENERIC) == {"tie_word_embeddings": True, "n_group": 8}


def test_rope_scalings_legacy_type_is_its_rope_type() -> None:
    legacy = rule.comparable({"rope_scaling": {"type": "yarn", "factor": 40}}, ())
    modern = rule.comparable({"rope_scaling": {"rope_type": "yarn", "factor": 40}}, ())
    both = rule.comparable({"rope_scaling": {"type": "yarn", "rope_type": "yarn", "factor": 40}}, ())
    assert legacy == modern == both
    assert rule.differences(legacy, rule.comparable({"rope_scaling": {"type": "linear", "factor": 40}}, ()))


@pytest.mark.parametrize(
    ("actor", "engine", "found"),
    [
        ({"topk_group": 4}, {"topk_group": 4}, []),
        ({"rope_theta": 10000}, {"rope_theta": 10000.0}, []),  # JSON's int and float are one value
        ({"topk_group": 4}, {"topk_group": 8}, [("topk_group", 4, 8)]),
        ({"norm_topk_prob": True}, {"norm_topk_prob": 1}, [("norm_topk_prob", True, 1)]),
        ({"rope_scaling": {"factor": 40}}, {"rope_scaling": None}, [("rope_scaling", {"factor": 40}, None)]),
        ({"rope_scaling": {"factor": 40}}, {"rope_scaling": {"factor": 40.5}}, [("rope_scaling", {"factor": 40},
                                                                                  {"factor": 40.5})]),
        ({"scoring_func": "sigmoid"}, {}, [("scoring_func", "sigmoid", rule.ABSENT)]),
        ({"a": 1, "b": 2}, {"b": 3, "a": 0}, [("a", 1, 0), ("b", 2, 3)]),
        ({}, {"x": None}, [("x", rule.ABSENT, None)]),  # a field set to None is not a field left out
        ({"f": [1, 2.0]}, {"f": (1.0, 2)}, []),  # lists compare element by element, numbers by value
        ({"f": [1, 2]}, {"f": [1, 3]}, [("f", [1, 2], [1, 3])]),
        ({"f": [1, 2]}, {"f": [1, 2, 3]}, [("f", [1, 2], [1, 2, 3])]),
        ({"f": [1]}, {"f": 1}, [("f", [1], 1)]),
    ],
    ids=[
        "equal",
        "int-float",
        "value",
        "bool-int",
        "none",
        "nested",
        "absent",
        "sorted",
        "absent-vs-none",
        "list-equal",
        "list-value",
        "list-length",
        "list-vs-scalar",
    ],
)  # fmt: skip
def test_differences_name_each_field_and_both_values(actor: dict, engine: dict, found: list[tuple]) -> None:
    assert [(d.field, d.actor, d.engine) for d in rule.differences(actor, engine)] == found


def test_the_message_names_the_field_both_values_and_the_fix() -> None:
    found = [rule.Difference("topk_group", 1, 2), rule.Difference("rope_scaling", {"factor": 40}, None)]
    assert rule.mismatch_message(found, engine="E", actor="A") == (
        "the rollout engine's model configuration (E) differs from the actor's (A) in 2 field(s) that change what the "
        "model computes: topk_group: actor 1, rollout engine 2; rope_scaling: actor {'factor': 40}, rollout engine "
        "None. The two would sample and score with different models, and the log-prob guard would see only a gap "
        "(none at all where the field does not act, e.g. yarn at short positions). Make both read the same config: "
        "remove the field from actor_rollout_ref.rollout.engine_kwargs.vllm.hf_overrides, or set it the same way for "
        "the actor under actor_rollout_ref.model.override_config.model_config (docs/rollout_guard.md, 'The engine's "
        "model configuration')."
    )
    message = rule.mismatch_message([rule.Difference("topk_group", 1, 2)], engine="E", actor="A")
    assert message.startswith("the rollout engine's model configuration (E) differs from the actor's (A) in 1 field")
    assert "topk_group: actor 1, rollout engine 2" in message
    assert "engine_kwargs.vllm.hf_overrides" in message
    assert "override_config.model_config" in message


# --- the patch on verl's worker ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model(tmp_path_factory.mktemp("model-config") / "model")


@pytest.fixture
def worker_class(monkeypatch: pytest.MonkeyPatch) -> Iterator[type]:
    """verl's worker class, patched, with trainer mode's device calls answered on the CPU."""
    from verl.workers import megatron_workers

    device = types.SimpleNamespace(get_rng_state=torch.get_rng_state, set_rng_state=torch.set_rng_state)
    monkeypatch.setattr(megatron_workers, "get_torch_device", lambda: device)
    monkeypatch.setattr(megatron_workers, "aggressive_empty_cache", lambda **_: None)
    monkeypatch.setattr(megatron_workers, "set_expandable_segments", lambda _on: None)
    apply_one(SPEC)
    try:
        yield megatron_workers.ActorRolloutRefWorker
    finally:
        restore_all()
        forget_applied()


def actor_config(model_dir: Path) -> Any:
    """The actor's config as verl's Megatron worker builds it: config.json, token ids from the tokenizer."""
    config = AutoConfig.from_pretrained(str(model_dir))
    config.update({"bos_token_id": 5, "eos_token_id": 6, "pad_token_id": 6})
    return config


def worker(worker_class: type, model_dir: Path, engine: Any) -> Any:
    built = object.__new__(worker_class)
    built._is_actor = True
    built.hf_config = actor_config(model_dir)
    built.rollout = types.SimpleNamespace(inference_engine=engine)
    built.actor = types.SimpleNamespace(actor_module=[torch.nn.Linear(1, 1)])
    built.config = types.SimpleNamespace(rollout=types.SimpleNamespace(free_cache_engine=False))
    built.torch_random_states = torch.get_rng_state()
    return built


def test_an_engine_built_from_the_actors_configuration_passes(
    worker_class: type, model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="r1_ascend.patches.verl_rollout_model_config")
    built = worker(worker_class, model_dir, CPUStandInLLM(str(model_dir), dtype="float32", max_model_len=64))
    built.actor.actor_module[0].eval()
    asyncio.run(built.trainer_mode())
    assert built.actor.actor_module[0].training, "the stock body ran after the check"
    assert "equals the actor's" in caplog.text


@pytest.mark.parametrize("fault", ENGINE_FAULTS)
def test_an_engine_configuration_fault_is_refused_when_the_engine_is_built(
    worker_class: type, model_dir: Path, fault: str
) -> None:
    """Each planted engine-configuration fault, given to the engine as the run's hf_overrides would give it."""
    config = json.loads((model_dir / "config.json").read_text())
    overrides = rollout_faults.get(fault).engine_overrides(config)
    engine = CPUStandInLLM(str(model_dir), dtype="float32", max_model_len=64, hf_overrides=overrides)
    built = worker(worker_class, model_dir, engine)
    built.actor.actor_module[0].eval()
    with pytest.raises(RolloutModelConfigError) as info:
        asyncio.run(built.trainer_mode())
    assert not built.actor.actor_module[0].training, "refused before trainer mode's body"
    message = str(info.value)
    assert message.startswith("patch verl_rollout_model_config: the rollout engine's model configuration")
    for field, value in overrides.items():
        assert value != config[field], "the fault changes the field"
        named = message.split(f"{field}: actor ", 1)
        assert len(named) == 2, f"{field} is not named: {message}"
        assert named[1].split(", rollout engine ", 1)[1].startswith(repr(value))


def test_a_worker_without_an_actor_or_a_rollout_is_left_alone(worker_class: type, model_dir: Path) -> None:
    engine = CPUStandInLLM(str(model_dir), dtype="float32", max_model_len=64, hf_overrides={"topk_group": 2})
    built = worker(worker_class, model_dir, engine)
    built._is_actor = False
    asyncio.run(built.trainer_mode())


def test_an_engine_that_keeps_no_model_config_is_a_drifted_target(worker_class: type, model_dir: Path) -> None:
    built = worker(worker_class, model_dir, types.SimpleNamespace(llm_engine=types.SimpleNamespace()))
    with pytest.raises(PatchTargetError, match=r"no inference_engine\.llm_engine\.model_config\.hf_config"):
        asyncio.run(built.trainer_mode())


def test_the_stand_in_engine_applies_hf_overrides_as_vllm_does(model_dir: Path) -> None:
    """A mapping updates fields, a callable returns the config (vLLM 0.9.1 ModelConfig.__init__)."""
    by_mapping = CPUStandInLLM(str(model_dir), dtype="float32", max_model_len=64, hf_overrides={"rope_scaling": None})
    assert by_mapping.hf_config.rope_scaling is None
    assert by_mapping.llm_engine.model_config.hf_config is by_mapping.hf_config
    assert by_mapping.model.model.rotary_emb.rope_type == "default", "the engine's model is built from it"

    def grouped_off(config: Any) -> Any:
        config.topk_group = config.n_group
        return config

    by_callable = CPUStandInLLM(str(model_dir), dtype="float32", max_model_len=64, hf_overrides=grouped_off)
    router = next(m for m in by_callable.model.modules() if hasattr(m, "topk_group"))
    assert router.topk_group == by_callable.hf_config.n_group
    with pytest.raises(TypeError, match="hf_overrides must be a mapping"):
        CPUStandInLLM(str(model_dir), dtype="float32", max_model_len=64, hf_overrides=[1])
