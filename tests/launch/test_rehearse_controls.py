"""The learning controls without a cluster: the reward permutation (r1_ascend.rehearse.reward_shuffle), the flat-curve
verdict, and the command's arguments naming the control's scenario, plan and summary file."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from r1_ascend import envs
from r1_ascend.rehearse import scenarios, training
from r1_ascend.rehearse.config import Plan, overrides
from r1_ascend.rehearse.inputs import Inputs
from r1_ascend.rehearse.reward_shuffle import permuted_rewards, shuffling


def _batch(lengths: list[int], width: int, scores: list[float]) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's layout: each response's score on its last valid token, the mask ones up to its length."""
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    rewards = torch.zeros(len(lengths), width)
    for row, (length, score) in enumerate(zip(lengths, scores, strict=True)):
        mask[row, :length] = 1
        rewards[row, max(length, 1) - 1] = score
    return rewards, mask


@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_permuted_rewards_move_each_score_to_another_responses_last_token(data: st.DataObject) -> None:
    rows = data.draw(st.integers(1, 12))
    width = data.draw(st.integers(1, 9))
    lengths = data.draw(st.lists(st.integers(0, width), min_size=rows, max_size=rows))
    scores = data.draw(st.lists(st.sampled_from([0.0, 1.0, 0.5, -1.0]), min_size=rows, max_size=rows))
    order = torch.tensor(data.draw(st.permutations(range(rows))))
    rewards, mask = _batch(lengths, width, scores)
    permuted = permuted_rewards(rewards, mask, order)
    assert permuted.shape == rewards.shape
    for row in range(rows):
        last = max(lengths[row], 1) - 1
        assert permuted[row, last] == scores[int(order[row])]
        assert permuted[row].count_nonzero() <= 1
    assert sorted(permuted.sum(-1).tolist()) == sorted(scores)
    identity = permuted_rewards(rewards, mask, torch.arange(rows))
    assert torch.equal(identity, rewards)


def test_a_mask_of_another_shape_is_refused() -> None:
    rewards, mask = _batch([2, 3], 4, [1.0, 0.0])
    with pytest.raises(ValueError, match=r"reward tensor \(2, 4\) and response mask \(2, 3\) differ"):
        permuted_rewards(rewards, mask[:, 1:], torch.arange(2))


def test_the_trainers_compute_reward_returns_each_batch_permuted_afresh() -> None:
    """Wrapped as in the workers: same scores per batch, another order each batch, the extra info untouched; the
    prompt part of the attention mask is not read as response."""
    scores = [float(i) for i in range(16)]
    rewards, response_mask = _batch([3] * 16, 5, scores)
    attention = torch.cat([torch.ones(16, 7, dtype=torch.long), response_mask], dim=1)
    data = SimpleNamespace(batch={"attention_mask": attention})
    extra = {"acc": scores}
    compute = shuffling(lambda data, reward_fn: (rewards.clone(), extra), seed=0)
    first, info = compute(data, None)
    second, _ = compute(data, None)
    assert info is extra
    for permuted in (first, second):
        assert sorted(permuted[:, 2].tolist()) == scores
        assert permuted[:, 2].tolist() != scores
    assert first[:, 2].tolist() != second[:, 2].tolist()


@pytest.mark.parametrize(
    ("curve", "flat"),
    [
        ({1: 0.1, 2: 0.2, 3: 0.1, 4: 0.2, 5: 0.15, 6: 0.2}, True),
        ({1: 0.2, 2: 0.2, 3: 0.2, 4: 0.39, 5: 0.39, 6: 0.39}, True),  # a rise just under 0.2
        ({1: 0.2, 2: 0.2, 3: 0.2, 4: 0.4, 5: 0.4, 6: 0.4}, False),  # a rise of exactly 0.2
        ({1: 0.45, 2: 0.45, 3: 0.45, 4: 0.5, 5: 0.5, 6: 0.5}, False),  # ends at 0.5
        ({1: 0.45, 2: 0.45, 3: 0.45, 4: 0.49, 5: 0.49, 6: 0.49}, True),
        ({1: 0.1, 2: 0.1, 3: 0.1, 4: 0.9, 5: 0.95, 6: 0.97}, False),  # the learning run's shape
    ],
)
def test_a_control_must_stay_flat(curve: dict[int, float], flat: bool) -> None:
    shape = training.Curve(curve, 3)
    if flat:
        training.check_flat(shape, "lr0")
    else:
        with pytest.raises(training.TrainingError, match=r"the control run \(lr0\) learned: .*curve: 1: "):
            training.check_flat(shape, "lr0")


def test_the_shuffle_switch_reaches_the_workers_environment_and_nothing_else_does(tmp_path: Path) -> None:
    key = f"runtime_env.env_vars.{envs.R1_ASCEND_REHEARSE_SHUFFLE_REWARDS}='1'"
    inputs = Inputs(tmp_path / "model", tmp_path / "mcore", tmp_path / "data")
    assert any(key in o for o in overrides(Plan(shuffle_rewards=True), inputs, tmp_path))
    assert not any(envs.R1_ASCEND_REHEARSE_SHUFFLE_REWARDS in o for o in overrides(Plan(), inputs, tmp_path))
    assert envs.rehearse_shuffle_rewards({envs.R1_ASCEND_REHEARSE_SHUFFLE_REWARDS: "1"})
    assert not envs.rehearse_shuffle_rewards({})
    assert not envs.rehearse_shuffle_rewards({envs.R1_ASCEND_REHEARSE_SHUFFLE_REWARDS: "0"})
    with pytest.raises(ValueError, match="expected 1"):
        envs.rehearse_shuffle_rewards({envs.R1_ASCEND_REHEARSE_SHUFFLE_REWARDS: "yes"})


@pytest.mark.parametrize(
    ("argv", "control", "shuffle"),
    [(["--lr", "0"], "lr0", False), (["--shuffle-rewards"], "shuffled-rewards", True), ([], None, False)],
)
def test_the_arguments_name_the_control_its_plan_and_summary_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, argv: list[str], control: str | None, shuffle: bool
) -> None:
    from r1_ascend.rehearse import run

    seen: list[tuple[Plan, Any]] = []

    def capture(out: Path, plan: Plan, sampler: Any, weights: Any, scenario: Any) -> dict:
        seen.append((plan, scenario))
        raise run.RehearsalError("stopped by the test")

    monkeypatch.setattr(run, "rehearse", capture)
    assert run.main(["--output-dir", str(tmp_path), *argv]) == 1
    ((plan, scenario),) = seen
    assert plan.shuffle_rewards is shuffle
    if control is None:
        assert scenario is scenarios.PLAIN
        assert plan.min_reward_rise is not None
        return
    assert scenario.variant == f"control-{control}"
    assert plan.min_reward_rise is None, "a control does not require the rise"
    assert scenario.plan(plan) == plan, "the plain run's plan"
    assert control in scenario.announce


@pytest.mark.parametrize(
    "argv",
    [
        ["--lr", "0", "--shuffle-rewards"],
        ["--shuffle-rewards", "--fault", "hang"],
        ["--lr", "0", "--rollout-fault", "not-synced"],
        ["--shuffle-rewards", "--resume"],
    ],
)
def test_a_control_with_anything_else_is_refused(tmp_path: Path, argv: list[str]) -> None:
    from r1_ascend.rehearse import run

    with pytest.raises(SystemExit) as exc:
        run.main(["--output-dir", str(tmp_path), *argv])
    assert exc.value.code == 2
