"""The reward loads through verl 0.6.1's own loader, with reward_kwargs, as the recipe configures it."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_get_custom_reward_fn_loads_compute_score_with_kwargs() -> None:
    import sys

    from verl.trainer.ppo.reward import get_custom_reward_fn

    sys.modules.pop("custom_module", None)  # verl caches the module under this name
    config = OmegaConf.create(
        {
            "custom_reward_function": {
                "path": str(REPO_ROOT / "recipe" / "deepscaler_reward.py"),
                "name": "compute_score",
                "reward_kwargs": {"accuracy_weight": 0.67, "format_weight": 0.33},
            }
        }
    )
    try:
        fn = get_custom_reward_fn(config)
        result = fn(
            data_source="deepscaler", solution_str="<think>r</think>\\boxed{3}", ground_truth="3", extra_info={}
        )
    finally:
        sys.modules.pop("custom_module", None)
    assert result["score"] == 0.67
    assert result["acc"] == 1.0
    assert result["format"] == 0.0


def test_batch_entry_point_signature_matches_batch_reward_manager() -> None:
    import inspect

    from verl.workers.reward_manager.batch import BatchRewardManager

    from r1_ascend.recipe.reward import compute_score_batch

    source = inspect.getsource(BatchRewardManager.verify)
    for keyword in ("data_sources=", "solution_strs=", "ground_truths=", "extra_infos="):
        assert keyword in source
    parameters = inspect.signature(compute_score_batch).parameters
    assert {"data_sources", "solution_strs", "ground_truths", "extra_infos"} <= set(parameters)
