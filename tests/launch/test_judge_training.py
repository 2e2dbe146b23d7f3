"""``verdicts.judge_training``: what a finished rehearsal learned and which model it trained, from its driver logs
and the workers' records. Each rule it composes is tested at its own boundary (``test_rehearse_training.py``,
``test_expert_checks.py``); these tests check that every one of them is applied and what the verdict reports."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest

from r1_ascend.patches.rules import rollout_guard as guard
from r1_ascend.rehearse.config import Plan
from r1_ascend.rehearse.expert_checks import ExpertLoadError
from r1_ascend.rehearse.training import TrainingError
from r1_ascend.rehearse.verdicts import judge_training

REWARDS = [0.12, 0.22, 0.30, 0.45, 0.62, 0.80, 0.95, 1.0]
GPT = "megatron.core.models.gpt.gpt_model.GPTModel"


def metrics(reward: float, gap: float) -> dict[str, float]:
    return {
        "critic/score/mean": reward,
        "actor/grad_norm": 1.5,
        "rollout_guard/log_prob_abs_diff_mean": gap,
        "actor/pg_loss": -0.02,
    }


def write_logs(directory: Path, rows: dict[int, dict[str, float]]) -> list[Path]:
    """Two driver logs (run 1, then the resumed run 2) with verl's step lines."""
    half = len(rows) // 2
    paths = []
    for name, steps in (("run1.log", [s for s in rows if s <= half]), ("run2.log", [s for s in rows if s > half])):
        lines = [f"step:{s} - " + " - ".join(f"{k}:{v}" for k, v in rows[s].items()) + "\n" for s in steps]
        (directory / name).write_text("".join(lines), encoding="utf-8")
        paths.append(directory / name)
    return paths


def bias(step: int) -> dict[str, list[float]]:
    return {"1": [0.1 * e + 0.001 * step * (-1) ** e for e in range(4)]}


def records(steps: int) -> list[dict[str, Any]]:
    """The workers' model records, then per step each worker's engine bias at the sync and its expert loads."""
    events: list[dict[str, Any]] = [
        {
            "t": 0.0,
            "pid": pid,
            "event": "model",
            "cls": GPT,
            "ep_rank": rank,
            "parameters": 3000,
            "tp": 1,
            "ep": 2,
            "pp": 1,
            "dp": 2,
        }
        for rank, pid in enumerate((11, 12))
    ]
    t = 0.0
    for step in range(1, steps + 1):
        for pid in (11, 12):
            t += 1.0
            events.append({"t": t, "pid": pid, "event": "engine_bias", "bias": bias(step - 1)})
        for rank, pid in enumerate((11, 12)):
            t += 1.0
            events.append(
                {
                    "t": t,
                    "pid": pid,
                    "event": "expert_load",
                    "step": step,
                    "rank": rank,
                    "ep": 2,
                    "optimizer_steps": 1,
                    "tokens": {"1": [10.0, 10.0, 10.0, 10.0]},
                    "bias": bias(step),
                }
            )
    return events


def rehearsal(tmp_path: Path, rows: dict[int, dict[str, float]], events: list[dict[str, Any]]) -> list[Path]:
    (tmp_path / "lifecycle").mkdir()
    for pid in {e["pid"] for e in events}:
        text = "".join(json.dumps(e) + "\n" for e in events if e["pid"] == pid)
        (tmp_path / "lifecycle" / f"lifecycle-{pid}.log").write_text(text, encoding="utf-8")
    return write_logs(tmp_path, rows)


def healthy_rows() -> dict[int, dict[str, float]]:
    return {i + 1: metrics(r, 0.001 * (i + 1)) for i, r in enumerate(REWARDS)}


def test_a_run_that_learned_reports_its_curve_model_experts_and_gap(tmp_path: Path) -> None:
    logs = rehearsal(tmp_path, healthy_rows(), records(len(REWARDS)))
    verdict = judge_training(tmp_path, logs, Plan())
    assert verdict["model"] == {
        "class": GPT,
        "parameters_per_rank": [3000],
        "layout": {"tp": 1, "ep": 2, "pp": 1, "dp": 2},
    }
    assert verdict["reward_curve"] == {i + 1: r for i, r in enumerate(REWARDS)}
    reward = verdict["reward"]
    assert isinstance(reward, dict)
    assert reward["first"] < 0.3 < 0.9 < reward["last"]
    assert verdict["rollout_actor_gap_max"] == pytest.approx(0.001 * len(REWARDS))
    assert set(verdict["moe"]) == {"experts", "smallest_ep_share", "bias_moves", "engine_bias"}


def test_a_flat_curve_fails_unless_the_plan_asks_for_no_rise(tmp_path: Path) -> None:
    rows = {s: metrics(0.2, 0.001) for s in range(1, 9)}
    logs = rehearsal(tmp_path, rows, records(8))
    with pytest.raises(TrainingError):
        judge_training(tmp_path, logs, Plan())
    assert judge_training(tmp_path, logs, dataclasses.replace(Plan(), min_reward_rise=None))["reward"]


@pytest.mark.parametrize(
    ("metric", "value"),
    [("critic/score/mean", math.nan), ("actor/grad_norm", 0.0), (guard.METRIC_WARNED, 1.0)],
    ids=["non-finite", "no-gradient", "guard-warned"],
)
def test_every_training_rule_is_applied(tmp_path: Path, metric: str, value: float) -> None:
    rows = healthy_rows()
    for step in rows:
        if metric != "critic/score/mean" or step == 3:
            rows[step][metric] = value
    logs = rehearsal(tmp_path, rows, records(len(REWARDS)))
    with pytest.raises(TrainingError):
        judge_training(tmp_path, logs, dataclasses.replace(Plan(), min_reward_rise=None))


def test_an_expert_failure_names_the_records(tmp_path: Path) -> None:
    events = [e for e in records(len(REWARDS)) if e["event"] != "expert_load"]
    logs = rehearsal(tmp_path, healthy_rows(), events)
    with pytest.raises(ExpertLoadError, match=f"; records: {tmp_path / 'lifecycle'}$"):
        judge_training(tmp_path, logs, Plan())


def test_without_model_records_the_verdict_says_so(tmp_path: Path) -> None:
    events = [e for e in records(len(REWARDS)) if e["event"] != "model"]
    logs = rehearsal(tmp_path, healthy_rows(), events)
    with pytest.raises(RuntimeError, match="no worker recorded the model it built"):
        judge_training(tmp_path, logs, Plan())
