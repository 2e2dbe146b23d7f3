"""Root pytest configuration: make the Ascend stack importable on a CPU machine before anything else runs.

verl computes ``is_npu_available`` when it is first imported and vllm-ascend imports ``torch_npu`` at module
level, so the ``torch_npu`` stub must be in place before any test module (or plugin) imports verl or vLLM.
"""

from __future__ import annotations

import os

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from collections.abc import Iterator

import pytest

from r1_ascend.testing import npu_stub

npu_stub.install()


@pytest.fixture(autouse=True)
def _leave_upstream_untouched() -> Iterator[None]:
    """Whatever a test patched through the overlay (directly, or via a vLLM plugin load), put the originals back."""
    yield
    from r1_ascend.patches import forget_applied, restore_all

    restore_all()
    forget_applied()


def pytest_report_header() -> list[str]:
    from r1_ascend.stack import installed_version

    names = ("verl", "vllm", "vllm-ascend", "megatron-core", "torch", "transformers", "ray")
    versions = ", ".join(f"{n} {installed_version(n) or 'missing'}" for n in names)
    return [f"upstream: {versions}", "torch_npu: CPU stub (no NPU), MindSpeed: fake (r1_ascend.testing)"]
