"""The rollout-config rules (r1_ascend.patches.rules.rollout_config) at their edges: a batch exactly as long as the
context, chunked prefill set or not, each engine option vllm-ascend 0.9.1 needs for a model and layout, and the graph
modes the offloading rollout cannot use. The config is a plain object with verl's ``RolloutConfig`` attributes."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from r1_ascend.patches.rules.rollout_config import (
    RolloutConfigError,
    ascend_scheduler_options,
    check_batched_tokens,
    check_engine_options,
    check_free_cache_engine,
    max_model_len,
    stock_length_check_would_fail,
    vllm_engine_kwargs,
)


def rollout(**settings: Any) -> SimpleNamespace:
    defaults = {
        "max_model_len": None,
        "prompt_length": 1024,
        "response_length": 3072,
        "max_num_batched_tokens": 8192,
        "enable_chunked_prefill": False,
        "engine_kwargs": None,
        "free_cache_engine": True,
        "enforce_eager": True,
        "max_num_seqs": 64,
    }
    return SimpleNamespace(**{**defaults, **settings})


def scheduler(enabled: bool = True, **extra: Any) -> dict[str, Any]:
    return {"vllm": {"additional_config": {"ascend_scheduler_config": {"enabled": enabled, **extra}}}}


# --- context length and batched tokens ---------------------------------------------------------------------------


def test_the_context_is_prompt_plus_response_unless_set() -> None:
    assert max_model_len(rollout()) == 4096
    assert max_model_len(rollout(max_model_len=5000)) == 5000
    assert max_model_len(rollout(max_model_len=0)) == 4096  # verl: 0 means unset


@pytest.mark.parametrize(
    "engine_kwargs", [None, {}, {"vllm": None}, {"vllm": {"additional_config": None}}, scheduler(False) | {}]
)
def test_missing_scheduler_settings_read_as_empty(engine_kwargs: Any) -> None:
    options = ascend_scheduler_options(rollout(engine_kwargs=engine_kwargs))
    assert options.get("enabled", False) is False


def test_the_engine_kwargs_are_those_under_vllm() -> None:
    assert vllm_engine_kwargs(rollout()) == {}
    assert vllm_engine_kwargs(rollout(engine_kwargs={"vllm": {"enable_expert_parallel": True}})) == {
        "enable_expert_parallel": True
    }


@pytest.mark.parametrize(
    ("batched", "settings", "refused"),
    [
        (4096, scheduler(), False),  # exactly the context: one sequence fits
        (4095, scheduler(), True),
        (4095, scheduler(enable_chunked_prefill=True), False),
        (4095, scheduler(False), False),  # plain V1 scheduler: chunked prefill always on
        (4095, None, False),
    ],
)
def test_batched_tokens_below_the_context_are_refused_only_without_chunked_prefill(
    batched: int, settings: Any, refused: bool
) -> None:
    config = rollout(max_num_batched_tokens=batched, engine_kwargs=settings)
    if refused:
        with pytest.raises(RolloutConfigError) as info:
            check_batched_tokens(config)
        assert str(info.value).startswith(
            f"rollout max_num_batched_tokens ({batched}) is smaller than max_model_len (4096) while vllm-ascend's"
        )
        assert "actor_rollout_ref.rollout.max_num_batched_tokens>=4096" in str(info.value)
    else:
        check_batched_tokens(config)


@pytest.mark.parametrize(
    ("batched", "chunked", "fails"), [(4095, True, True), (4096, True, False), (4095, False, False)]
)
def test_stock_verls_own_check(batched: int, chunked: bool, fails: bool) -> None:
    assert (
        stock_length_check_would_fail(rollout(max_num_batched_tokens=batched, enable_chunked_prefill=chunked)) is fails
    )


def test_the_kv_cache_must_be_freed() -> None:
    check_free_cache_engine(rollout())
    with pytest.raises(RolloutConfigError, match=r"free_cache_engine=False is not supported"):
        check_free_cache_engine(rollout(free_cache_engine=False))


# --- engine options for a model and a layout ---------------------------------------------------------------------


def engine(*, eager: bool = True, torchair: dict[str, Any] | None = None, **kwargs: Any) -> SimpleNamespace:
    additional = kwargs.pop("additional", {})
    if torchair is not None:
        additional = {**additional, "torchair_graph_config": torchair}
    return rollout(enforce_eager=eager, engine_kwargs={"vllm": {"additional_config": additional, **kwargs}})


def problems(config: SimpleNamespace, model_type: str = "deepseek_v3", **options: Any) -> list[str]:
    layout = {"is_moe": True, "dp_size": 1, **options}
    return check_engine_options(config, model_type=model_type, **layout)


def test_eager_deepseek_on_one_dp_rank_needs_nothing_more() -> None:
    assert problems(engine()) == []


def test_graph_mode_with_enforce_eager_is_refused() -> None:
    (found,) = problems(engine(torchair={"enabled": True}), offload=False)
    assert "torchair_graph_config.enabled=true with enforce_eager=True" in found


def test_deepseek_without_eager_needs_torchair() -> None:
    (found,) = problems(engine(eager=False), offload=False)
    assert "without TorchAir graph mode" in found
    assert problems(engine(eager=False, torchair={"enabled": True}), offload=False) == []


def test_torchair_is_for_deepseek_only() -> None:
    found = problems(engine(eager=False, torchair={"enabled": True}), model_type="qwen2", offload=False)
    assert found == [
        "TorchAir graph mode is only supported for DeepSeek models in vllm-ascend 0.9.1 (model_type 'qwen2'); "
        "remove actor_rollout_ref.rollout.engine_kwargs.vllm.additional_config.torchair_graph_config"
    ]


@pytest.mark.parametrize(("sizes", "ok"), [([], True), ([8, 64], True), ([8, 32], False)])
def test_graph_batch_sizes_must_hold_the_full_batch(sizes: list[int], ok: bool) -> None:
    config = engine(eager=False, torchair={"enabled": True, "graph_batch_sizes": sizes})
    found = problems(config, offload=False)
    assert (found == []) is ok
    if not ok:
        assert found == [
            f"torchair_graph_config.graph_batch_sizes {sizes} does not contain max_num_seqs (64): full decode "
            "batches would fall outside every captured graph; add it"
        ]


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"enable_expert_parallel": True, "additional": {"refresh": True}}, []),
        ({"additional": {"refresh": True}}, ["enable_expert_parallel is not true"]),
        ({"enable_expert_parallel": True}, ["additional_config.refresh is not true"]),
        ({}, ["enable_expert_parallel is not true", "additional_config.refresh is not true"]),
    ],
)
def test_several_dp_ranks_need_expert_parallelism_and_a_refresh(kwargs: dict[str, Any], expected: list[str]) -> None:
    found = problems(engine(**kwargs), dp_size=2)
    assert len(found) == len(expected)
    for message, fragment in zip(found, expected, strict=True):
        assert fragment in message
        assert message.startswith("rollout DP size 2")


def test_one_dp_rank_or_no_dp_patch_needs_neither() -> None:
    assert problems(engine(), dp_size=1) == []
    assert problems(engine(), dp_size=4, dp_groups=False) == []
    assert problems(engine(additional={"refresh": True}), dp_size=4, is_moe=False) == []


# --- graphs the offloading rollout cannot use ----------------------------------------------------------------------


def test_acl_graph_mode_is_refused_with_offloading() -> None:
    (found,) = problems(engine(eager=False), model_type="qwen2")
    assert found.startswith("enforce_eager=False without TorchAir selects ACL graph mode")
    assert problems(engine(eager=False), model_type="qwen2", offload=False) == []
    assert problems(engine(), model_type="qwen2") == []


@pytest.mark.parametrize(
    ("torchair", "live", "fragment"),
    [
        ({"enabled": True}, False, "patch vllm_ascend_torchair_live_params disabled"),
        ({"enabled": True, "use_cached_graph": True}, True, "use_cached_graph=true serialises graphs"),
        ({"enabled": True, "enable_frozen_parameter": True}, True, "enable_frozen_parameter=true asks TorchAir"),
    ],
)
def test_torchair_must_not_keep_parameter_addresses(torchair: dict[str, Any], live: bool, fragment: str) -> None:
    config = engine(eager=False, torchair=torchair)
    (found,) = problems(config, live_params=live)
    assert fragment in found
    assert problems(config, live_params=live, offload=False) == []


def test_torchair_with_live_parameters_is_fine_with_offloading() -> None:
    config = engine(
        eager=False, torchair={"enabled": True, "use_cached_graph": False, "enable_frozen_parameter": False}
    )
    assert problems(config) == []


# --- what each refusal tells the user, word for word ---------------------------------------------------------------

KWARGS = "actor_rollout_ref.rollout.engine_kwargs.vllm"
REALLOCATES = "the offloading rollout frees and re-allocates every parameter's storage each step"


def test_the_kv_cache_refusal_says_why_and_the_setting() -> None:
    with pytest.raises(RolloutConfigError) as refused:
        check_free_cache_engine(rollout(free_cache_engine=False))
    assert str(refused.value) == (
        "actor_rollout_ref.rollout.free_cache_engine=False is not supported by the offloading rollout: the rollout "
        "weights and KV cache would stay on the NPU during training, which cannot fit for DeepSeek-V3 (certain OOM). "
        "Set actor_rollout_ref.rollout.free_cache_engine=True."
    )


def test_a_deepseek_model_without_graph_mode_is_told_only_to_enable_torchair() -> None:
    """With the offloading rollout too: a DeepSeek model never falls to ACL graph mode, so only TorchAir is asked."""
    (found,) = problems(engine(eager=False))
    assert found.startswith("model_type 'deepseek_v3' without TorchAir graph mode")


def test_graph_mode_in_eager_mode_names_the_setting_to_change() -> None:
    (found,) = problems(engine(torchair={"enabled": True}), offload=False)
    assert found == (
        f"{KWARGS}.additional_config.torchair_graph_config.enabled=true with enforce_eager=True: vllm-ascend 0.9.1 "
        "refuses graph mode in eager mode; set actor_rollout_ref.rollout.enforce_eager=False"
    )


def test_several_dp_ranks_are_told_what_each_missing_setting_does() -> None:
    found = problems(engine(), dp_size=2)
    assert found == [
        f"rollout DP size 2 with a MoE model but {KWARGS}.enable_expert_parallel is not true: every DP rank would "
        "hold all experts; set it to true (EP = all rollout ranks)",
        f"rollout DP size 2 but {KWARGS}.additional_config.refresh is not true: the DP/EP groups are built before "
        "LLM(), which leaves vllm-ascend's AscendConfig at its defaults unless refreshed; set refresh: true",
    ]


def test_a_cached_graph_is_refused_with_the_key_and_the_reason() -> None:
    (found,) = problems(engine(eager=False, torchair={"enabled": True, "use_cached_graph": True}))
    assert found == (
        f"{KWARGS}.additional_config.torchair_graph_config.use_cached_graph=true serialises graphs with frozen "
        f"parameter addresses, but {REALLOCATES}; set it to false"
    )
