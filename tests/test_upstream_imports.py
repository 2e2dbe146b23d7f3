"""The test environment imports the real upstream modules the patches target, and our packages are ours."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from r1_ascend.stack import installed_version, package_pin

REPO_ROOT = Path(__file__).resolve().parents[1]

REAL_UPSTREAM_MODULES = [
    ("verl", "verl.workers.megatron_workers"),
    ("verl", "verl.workers.rollout.vllm_rollout"),
    ("vllm", "vllm.v1.engine.core"),
    ("vllm", "vllm.distributed.parallel_state"),
    ("vllm-ascend", "vllm_ascend.patch.platform"),
    ("vllm-ascend", "vllm_ascend.patch.worker"),
    ("megatron-core", "megatron.core.parallel_state"),
]


@pytest.mark.parametrize(("distribution", "module_name"), REAL_UPSTREAM_MODULES)
def test_real_upstream_module_imports_at_pinned_version(distribution: str, module_name: str) -> None:
    """Each targeted module is the installed upstream one (not a fake) at the pinned version."""
    module = importlib.import_module(module_name)
    assert "site-packages" in str(module.__file__), f"{module_name} was imported from {module.__file__}"
    assert installed_version(distribution) == package_pin(distribution)


def test_vllm_platform_is_ascend_with_stubbed_torch_npu() -> None:
    """vllm-ascend's platform plugin is active, so Ascend code paths are the ones imported."""
    from vllm.platforms import current_platform

    assert current_platform.device_type == "npu"


def test_stub_reports_no_npu() -> None:
    """The torch_npu stub never pretends a device exists, so verl's NPU-only import block stays off."""
    import torch
    import torch_npu

    from r1_ascend.testing import npu_stub

    assert npu_stub.is_installed()
    assert torch_npu.__spec__ is not None
    assert torch.npu.is_available() is False
    from verl.utils.device import is_npu_available

    assert is_npu_available is False


@pytest.mark.parametrize("package", ["r1_ascend", "r1_ascend.patches", "r1_ascend.recipe", "r1_ascend.data"])
def test_our_packages_come_from_this_repository(package: str) -> None:
    """Import names do not collide with anything verl or its dependencies install."""
    module = importlib.import_module(package)
    assert Path(module.__file__).resolve().is_relative_to(REPO_ROOT)
