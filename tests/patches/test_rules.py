"""The overlay's pure rules (r1_ascend.patches.rules) and its single error hierarchy."""

from __future__ import annotations

import inspect

import pytest
from hypothesis import given
from hypothesis import strategies as st

import r1_ascend.patches as patches
from r1_ascend.patches import PATCHES, DpEpConfigError, PatchConfigError, PatchError
from r1_ascend.patches.rules.dp_layout import plan_dp_ep_layout, rollout_dp_size
from r1_ascend.patches.rules.switches import read_switches

NAMES = [spec.name for spec in PATCHES]


@given(st.integers(min_value=1, max_value=4096), st.integers(min_value=-2, max_value=64))
def test_rollout_dp_size_is_world_over_tp_or_a_clear_error(world: int, tp: int) -> None:
    if tp >= 1 and world % tp == 0:
        dp = rollout_dp_size(world, tp)
        assert dp * tp == world
        assert plan_dp_ep_layout(world, world - 1, tp).dp_size == dp  # the patch's plan asks the same rule
    else:
        with pytest.raises(DpEpConfigError, match="tensor_model_parallel_size"):
            rollout_dp_size(world, tp)
        with pytest.raises(DpEpConfigError):
            plan_dp_ep_layout(world, 0, tp)


@given(st.sets(st.sampled_from(NAMES)), st.sets(st.text("abcxyz_", min_size=1, max_size=8)))
def test_switches_from_the_environment(chosen: set[str], unknown: set[str]) -> None:
    unknown -= set(NAMES)
    environ = {"R1_ASCEND_DISABLE": " , ".join(sorted(chosen | unknown))}
    lenient = read_switches(environ, strict=False)
    assert lenient.disabled == chosen
    assert not lenient.disable_all
    assert all(lenient.enabled(name) == (name not in chosen) for name in NAMES)
    if unknown:
        with pytest.raises(PatchConfigError, match="unknown patch name"):
            read_switches(environ)
    else:
        assert read_switches(environ) == lenient


@pytest.mark.parametrize("value", ["1", "true", "YES"])
def test_disable_all_switches_off_every_patch(value: str) -> None:
    switches = read_switches({"R1_ASCEND_DISABLE_ALL": value, "R1_ASCEND_DISABLE": "not_a_patch"})
    assert switches.disable_all
    assert switches.disabled == frozenset(NAMES)
    assert read_switches({}, disable_all=True).disabled == frozenset(NAMES)
    assert read_switches({"R1_ASCEND_DISABLE_ALL": value}, disable_all=False).disabled == frozenset()


def test_every_patch_error_derives_from_patch_error() -> None:
    errors = [obj for obj in vars(patches).values() if inspect.isclass(obj) and issubclass(obj, BaseException)]
    assert len(errors) >= 15
    for error in errors:
        assert issubclass(error, PatchError), error
    for error in (patches.DpEpConfigError, patches.RolloutConfigError, patches.RolloutGuardConfigError):
        assert issubclass(error, ValueError), error
    assert issubclass(PatchError, RuntimeError)
