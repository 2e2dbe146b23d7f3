"""r1-ascend guard-levels: levels proposed from the guard statistics healthy runs logged."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from r1_ascend.patches.rules import rollout_guard as guard
from r1_ascend.report import guard_levels

from .conftest import RunWriter


@given(st.floats(min_value=1e-12, max_value=1e6, allow_nan=False))
@example(3.481987962570348e-12)  # rounding to 12 decimals once turned it into 4e-12
def test_round_up_never_rounds_down_and_keeps_two_digits(value: float) -> None:
    rounded = guard_levels.round_up(value)
    assert rounded >= value * (1 - 1e-12)
    assert rounded <= value * 1.1 + 1e-300  # at most one unit in the second significant digit
    mantissa = f"{rounded:.6e}".split("e")[0].rstrip("0").rstrip(".")
    assert len(mantissa.replace(".", "").lstrip("0")) <= 2


def test_levels_are_twice_and_four_times_the_healthy_max_with_floors() -> None:
    values = {"abs_diff_mean": [0.003, 0.0096, math.nan], "tail_fraction": [0.0, 0.0], "kl_k3": [6.4e-4]}
    by_name = {p.statistic: p for p in guard_levels.propose(values)}
    assert set(by_name) == {"abs_diff_mean", "tail_fraction", "kl_k3"}, "no value: no proposal"
    mean = by_name["abs_diff_mean"]
    assert (mean.steps, mean.healthy_max, mean.warn, mean.stop) == (2, 0.0096, 0.02, 0.039), "NaN is not healthy"
    assert (by_name["tail_fraction"].warn, by_name["tail_fraction"].stop) == guard_levels.FLOORS["tail_fraction"]
    assert (by_name["kl_k3"].warn, by_name["kl_k3"].stop) == (0.0013, 0.0026)
    block = guard_levels.yaml_block(list(by_name.values()))
    from omegaconf import OmegaConf

    config = guard.GuardConfig.from_config(OmegaConf.create(block))  # the printed block is a valid config
    assert config.stop["abs_diff_mean"] == 0.039


@pytest.fixture(scope="module")
def healthy_runs(verl_modules, tmp_path_factory) -> list[Path]:
    runs = []
    for seed in (3, 4):
        writer = RunWriter(verl_modules, tmp_path_factory.mktemp("levels") / f"run{seed}", seed=seed)
        writer.segment(range(1, 7), log_name="train.log", planned=6, log_prob_drift=lambda _step: 0.01)
        runs.append(writer.run.log_files[0])
    return runs


def test_command_reads_every_run_and_prints_a_config_block(healthy_runs: list[Path], capsys) -> None:
    assert guard_levels.main([*map(str, healthy_runs), "--yaml"]) == 0
    out = capsys.readouterr().out
    assert "r1_ascend:\n  rollout_guard:" in out
    steps_line = next(line for line in out.splitlines() if line.startswith("abs_diff_mean"))
    assert steps_line.split()[1] == "12", "6 steps from each of the two runs"


def test_too_few_steps_exit_1_and_no_guard_metrics_exit_2(healthy_runs: list[Path], tmp_path: Path, capsys) -> None:
    assert guard_levels.main([str(healthy_runs[0])]) == 1
    assert "only 6 healthy steps" in capsys.readouterr().err
    empty = tmp_path / "empty.log"
    empty.write_text("step:1 - critic/score/mean:0.5\n")
    assert guard_levels.main([str(empty)]) == 2
    assert "no rollout_guard/*" in capsys.readouterr().err
    assert guard_levels.main([str(tmp_path / "missing")]) == 2
