"""Read the pinned stack (``stack.toml``) and compare it with what is installed."""

from __future__ import annotations

import functools
import tomllib
from dataclasses import dataclass
from importlib import metadata
from importlib.resources import files
from typing import Any


@functools.cache
def pins() -> dict[str, Any]:
    """The parsed ``stack.toml`` (cached; the file ships inside the package)."""
    return tomllib.loads(files("r1_ascend").joinpath("stack.toml").read_text(encoding="utf-8"))


def package_pin(distribution: str) -> str:
    """The exact pinned version of a Python distribution, e.g. ``package_pin("verl") == "0.6.1"``."""
    packages: dict[str, str] = pins()["packages"]
    try:
        return packages[distribution]
    except KeyError:
        msg = f"{distribution!r} is not pinned in src/r1_ascend/stack.toml (pinned: {', '.join(sorted(packages))})"
        raise KeyError(msg) from None


def installed_version(distribution: str) -> str | None:
    """The installed version of a distribution, or None when it is not installed."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


@dataclass(frozen=True)
class PinCheck:
    distribution: str
    pinned: str
    installed: str | None
    allowed_on_cpu: str | None = None  # a documented CPU-test deviation (stack.toml [cpu_test])

    @property
    def ok(self) -> bool:
        if self.installed is None:
            return False
        local_free = self.installed.split("+", 1)[0]
        return local_free == self.pinned or (self.allowed_on_cpu is not None and local_free == self.allowed_on_cpu)

    @property
    def status(self) -> str:
        if self.installed is None:
            return "missing"
        if self.installed.split("+", 1)[0] == self.pinned:
            return "ok"
        if self.ok:
            return "cpu-test"
        return "mismatch"


def check_installed(*, npu_present: bool) -> list[PinCheck]:
    """Compare every pinned distribution with the installed one.

    On a machine without an NPU, ``torch-npu`` cannot be installed for real (it needs CANN) and torch is the
    CPU build named in ``[cpu_test]``; both are reported, not treated as failures.
    """
    cpu_test: dict[str, str] = pins().get("cpu_test", {})
    checks = []
    for dist, pinned in pins()["packages"].items():
        allowed = None if npu_present else cpu_test.get(dist)
        checks.append(PinCheck(dist, pinned, installed_version(dist), allowed))
    return checks
