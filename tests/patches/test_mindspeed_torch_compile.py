"""mindspeed_torch_compile: the real compiler inside ``_build_rollout``, MindSpeed's stand-in everywhere else.

Runs against verl 0.6.1's real ``ActorRolloutRefWorker._build_rollout`` and the MindSpeed fake (a behavioural
equivalent of MindSpeed f6688c61's patch registry, see src/r1_ascend/testing/mindspeed_fake.py).
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from r1_ascend.patches import PatchTargetError, apply_one, patched_by, spec_by_name
from r1_ascend.patches.mindspeed_torch_compile import real_torch_compile
from r1_ascend.testing import mindspeed_fake

SPEC = spec_by_name("mindspeed_torch_compile")
REAL_COMPILE = torch.compile


class RolloutBuildFailed(RuntimeError):
    pass


@pytest.fixture
def workers() -> types.ModuleType:
    # Imported before the fake exists, as on a CPU machine: verl's module-level `repatch` stays None, so no other
    # test in this process ever calls the fake.
    import verl.workers.megatron_workers as module

    return module


@pytest.fixture
def mindspeed(workers: types.ModuleType) -> Iterator[types.ModuleType]:
    """MindSpeed loaded as verl's Megatron worker loads it: importing the adaptor applies the stand-in."""
    mindspeed_fake.install()
    import mindspeed.megatron_adaptor as adaptor

    assert torch.compile is not REAL_COMPILE
    yield adaptor
    mindspeed_fake.uninstall()
    assert torch.compile is REAL_COMPILE


@pytest.fixture
def mindspeed_without_entry(workers: types.ModuleType) -> Iterator[None]:
    mindspeed_fake.install(register_torch_compile=False)
    import mindspeed.megatron_adaptor  # noqa: F401

    yield
    mindspeed_fake.uninstall()


def _stand_in() -> Any:
    from mindspeed.patch_utils import MindSpeedPatchesManager

    return MindSpeedPatchesManager.patches_info["torch.compile"].final_patch_func


def _record_compile_then(monkeypatch: pytest.MonkeyPatch, workers: types.ModuleType, seen: list[Any]) -> None:
    """Make the first statement of the real ``_build_rollout`` record ``torch.compile`` and fail."""

    def first_step(*args: Any, **kwargs: Any) -> Any:
        seen.append(torch.compile)
        raise RolloutBuildFailed("rollout engine failed to start")

    monkeypatch.setattr(workers, "omega_conf_to_dataclass", first_step)


def test_real_build_rollout_sees_real_compile_and_stand_in_returns_when_it_raises(
    mindspeed: types.ModuleType, workers: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    apply_one(SPEC)
    worker_cls = workers.ActorRolloutRefWorker
    assert patched_by(worker_cls.__dict__["_build_rollout"]) == "mindspeed_torch_compile"
    stand_in = torch.compile
    assert stand_in is _stand_in()
    seen: list[Any] = []
    _record_compile_then(monkeypatch, workers, seen)
    worker = object.__new__(worker_cls)
    worker.config = types.SimpleNamespace(rollout={}, model={})

    with pytest.raises(RolloutBuildFailed):
        worker._build_rollout(trust_remote_code=False)

    assert seen == [REAL_COMPILE]
    assert torch.compile is stand_in
    assert _stand_in() is stand_in


def test_without_the_patch_the_rollout_build_gets_the_stand_in(
    mindspeed: types.ModuleType, workers: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The problem the patch solves: stock _build_rollout runs with MindSpeed's dummy compiler."""
    seen: list[Any] = []
    _record_compile_then(monkeypatch, workers, seen)
    worker = object.__new__(workers.ActorRolloutRefWorker)
    worker.config = types.SimpleNamespace(rollout={}, model={})
    with pytest.raises(RolloutBuildFailed):
        worker._build_rollout()
    assert seen == [_stand_in()]


def test_window_covers_from_torch_import_compile_copies(mindspeed: types.ModuleType) -> None:
    user = types.ModuleType("r1_ascend_test_compile_user")
    user.compile = torch.compile  # `from torch import compile`, done after MindSpeed patched torch
    user.my_compile = torch.compile  # a copy under another name: documented as not covered
    sys.modules[user.__name__] = user
    try:
        stand_in = torch.compile
        with real_torch_compile():
            assert user.compile is REAL_COMPILE
            assert user.my_compile is stand_in
            compiled = torch.compile(lambda x: x + 1)
            assert compiled is not None
        assert user.compile is stand_in
        assert torch.compile is stand_in
    finally:
        del sys.modules[user.__name__]


def test_stand_in_is_still_a_no_op_compiler_after_the_window(mindspeed: types.ModuleType) -> None:
    with real_torch_compile():
        pass

    def double(x: int) -> int:
        return 2 * x

    assert torch.compile(double)(3) == 6
    assert torch.compile(dynamic=True)(double)(4) == 8
    assert torch.compile is not REAL_COMPILE


def test_window_after_repatch_in_worker_init(mindspeed: types.ModuleType) -> None:
    """verl's worker __init__ calls repatch(), which removes and re-applies every MindSpeed patch."""
    with real_torch_compile():
        assert torch.compile is REAL_COMPILE
    mindspeed.repatch({})
    assert torch.compile is _stand_in()
    with real_torch_compile():
        assert torch.compile is REAL_COMPILE
    assert torch.compile is _stand_in()


def test_nested_window_keeps_the_real_compiler_until_the_outer_one_ends(mindspeed: types.ModuleType) -> None:
    stand_in = torch.compile
    with real_torch_compile():
        with real_torch_compile():
            assert torch.compile is REAL_COMPILE
        assert torch.compile is REAL_COMPILE
    assert torch.compile is stand_in


def test_missing_registry_entry_is_a_clear_error(mindspeed_without_entry: None) -> None:
    before = torch.compile
    with pytest.raises(PatchTargetError) as info, real_torch_compile(mindspeed_commit="f6688c61bcfe"):
        pytest.fail("the window must not open")
    message = str(info.value)
    assert 'patches_info["torch.compile"] is missing' in message
    assert "torch.jit.script" in message  # what is registered instead
    assert "f6688c61bcfe" in message
    assert "R1_ASCEND_DISABLE=mindspeed_torch_compile" in message
    assert torch.compile is before


def test_missing_mindspeed_is_a_clear_error(workers: types.ModuleType) -> None:
    assert not mindspeed_fake.is_installed()
    expected = r"cannot import mindspeed\.patch_utils.*R1_ASCEND_DISABLE="
    with pytest.raises(PatchTargetError, match=expected), real_torch_compile():
        pytest.fail("the window must not open")
    assert torch.compile is REAL_COMPILE


def test_foreign_rebinding_is_reported_not_overwritten(mindspeed: types.ModuleType) -> None:
    def somebody_elses_compile(*args: Any, **kwargs: Any) -> Any:
        return args[0]

    stand_in = torch.compile
    torch.compile = somebody_elses_compile
    try:
        with pytest.raises(PatchTargetError, match="something else rebound it"), real_torch_compile():
            pytest.fail("the window must not open")
        assert torch.compile is somebody_elses_compile
    finally:
        torch.compile = stand_in


def test_remove_patch_failing_halfway_still_restores_the_stand_in(
    mindspeed: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MindSpeed's remove_patch rebinds module by module; if it stops after torch, the window still closes."""
    from mindspeed.patch_utils import MindSpeedPatchesManager

    entry = MindSpeedPatchesManager.patches_info["torch.compile"]
    stand_in = torch.compile
    user = types.ModuleType("r1_ascend_test_compile_user_halfway")
    user.compile = stand_in
    sys.modules[user.__name__] = user

    def remove_halfway() -> None:
        torch.compile = entry.orig_func  # the first module is done ...
        raise RuntimeError("remove_patch failed on the next module")  # ... the next one fails

    monkeypatch.setattr(entry, "remove_patch", remove_halfway)
    try:
        with pytest.raises(RuntimeError, match="failed on the next module"), real_torch_compile():
            pytest.fail("the block must not run when the switch failed")
        assert torch.compile is stand_in
        assert user.compile is stand_in
    finally:
        del sys.modules[user.__name__]
