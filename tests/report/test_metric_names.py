"""The metric names the report reads are the ones the installed verl 0.6.1 writes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from r1_ascend.report import metric_names as mn


@pytest.fixture(scope="module")
def verl_source() -> str:
    import verl

    root = Path(verl.__file__).parent
    files = [
        "trainer/ppo/metric_utils.py",
        "trainer/ppo/ray_trainer.py",
        "trainer/ppo/core_algos.py",
        "workers/megatron_workers.py",
        "workers/actor/megatron_actor.py",
    ]
    return "\n".join((root / f).read_text(encoding="utf-8") for f in files)


@pytest.mark.parametrize(
    "name",
    [
        mn.PROMPT_LENGTH_MEAN,
        mn.RESPONSE_LENGTH_MEAN,
        mn.RESPONSE_LENGTH_MAX,
        mn.THROUGHPUT_PER_DIE,
        mn.MAX_MEMORY_ALLOCATED_GB,
        mn.MAX_MEMORY_RESERVED_GB,
        mn.REWARD_MEAN,
        mn.SCORE_MEAN,
        mn.ENTROPY,
        mn.KL_LOSS,
        mn.PPO_KL,
    ],
)
def test_literal_metric_names_appear_in_verl(verl_source: str, name: str) -> None:
    assert f'"{name}"' in verl_source


@pytest.mark.parametrize(
    ("metric", "timer_call"),
    [
        (mn.STEP_TIME, 'marked_timer("step"'),
        (mn.GEN_TIME, 'marked_timer("gen"'),
        (mn.REWARD_TIME, 'marked_timer("reward"'),
        (mn.OLD_LOG_PROB_TIME, 'marked_timer("old_log_prob"'),
        (mn.UPDATE_ACTOR_TIME, 'marked_timer("update_actor"'),
        (mn.GENERATE_SEQUENCES_TIME, 'simple_timer("generate_sequences"'),
    ],
)
def test_timing_names_come_from_verl_timers(verl_source: str, metric: str, timer_call: str) -> None:
    assert metric.startswith("timing_s/")
    assert timer_call in verl_source
    assert 'f"timing_s/{name}"' in verl_source


def test_reference_timer_is_named_by_the_role_string() -> None:
    from verl.trainer.ppo.utils import Role

    assert f"timing_s/{Role.RefPolicy}" == mn.REF_TIME


def test_reshard_timer_is_not_in_stock_verl(verl_source: str) -> None:
    assert '"reshard"' not in verl_source  # hence the documented fallback


def test_validation_names_match_verl(verl_source: str) -> None:
    from verl.trainer.ppo.metric_utils import process_validation_metrics

    processed = process_validation_metrics(["openai/gsm8k", "openai/gsm8k"], ["u1", "u2"], {"acc": [1.0, 0.0]})
    metric_names = list(processed["openai/gsm8k"]["acc"])
    assert "mean@1" in metric_names
    assert 'metric_sec = "val-core"' in verl_source
    assert 'pfx = f"{metric_sec}/{data_source}/{var_name}/{metric_name}"' in verl_source
    match = mn.VAL_CORE_MEAN.match("val-core/openai/gsm8k/acc/mean@1")
    assert match is not None
    assert (match["source"], match["var"], match["n"]) == ("openai/gsm8k", "acc", "1")
    assert mn.VAL_CORE_MEAN.match("val-core/openai/gsm8k/acc/best@4/mean") is None


def test_dump_fields_match_verl(verl_source: str) -> None:
    block = verl_source[verl_source.index("def _dump_generations") :]
    block = block[: block.index("def _log_rollout_data")]
    written = set(re.findall(r'"(\w+)": ', block))
    assert set(mn.DUMP_BASE_FIELDS) == written
