"""``r1-ascend doctor``: the installed stack against the pins, the NPU/CANN environment, and every patch target.

By default patch targets are checked in upstream *source* (fast, nothing heavy imported). ``--import`` also
imports the upstream modules and resolves every target exactly as the installer will (slower; it needs an
importable ``torch_npu``: on a machine without an NPU run ``python -m r1_ascend.testing.cpu_doctor --import``,
which puts the CPU test stub in place first).
"""

from __future__ import annotations

import argparse
import glob
import os
import platform
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from r1_ascend.stack import check_installed, pins

if TYPE_CHECKING:
    from r1_ascend.patches import Target
    from r1_ascend.patches.source_check import StaticResult

_CANN_VERSION_FILES = (
    "/usr/local/Ascend/ascend-toolkit/latest/version.cfg",
    "/usr/local/Ascend/ascend-toolkit/latest/toolkit/version.info",
)


@dataclass(frozen=True)
class Row:
    item: str
    expected: str
    found: str
    verdict: str  # "ok" | "note" | "FAIL"


def npu_devices() -> list[str]:
    return sorted(glob.glob("/dev/davinci[0-9]*"))


def cann_version() -> str | None:
    home = os.environ.get("ASCEND_HOME_PATH") or os.environ.get("ASCEND_TOOLKIT_HOME")
    candidates = [*(f"{home}/version.cfg" for _ in [0] if home), *_CANN_VERSION_FILES]
    for candidate in candidates:
        path = Path(candidate)
        if path.is_file():
            for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
                if "version" in line.lower() and "=" in line:
                    return line.split("=", 1)[1].strip().strip("[]")
    return None


def stack_rows(npu_present: bool) -> list[Row]:
    rows = [
        Row(
            "python",
            str(pins()["python"]),
            platform.python_version(),
            "ok" if platform.python_version().startswith(f"{pins()['python']}.") else "FAIL",
        )
    ]
    for check in check_installed(npu_present=npu_present):
        found = check.installed or "-"
        if check.status == "ok":
            verdict = "ok"
        elif check.status == "cpu-test":
            verdict = "note"
            found += " (CPU test build)"
        elif check.distribution == "torch-npu" and not npu_present:
            verdict = "note"
            found += " (no NPU: expected)"
        else:
            verdict = "FAIL"
        rows.append(Row(check.distribution, check.pinned, found, verdict))
    rows.append(mindspeed_row(npu_present))
    return rows


def mindspeed_row(npu_present: bool) -> Row:
    """MindSpeed is not on PyPI: check the checkout's commit and the registration mindspeed_torch_compile needs."""
    from r1_ascend.mindspeed_source import find_mindspeed

    commit = str(pins()["sources"]["mindspeed"]["commit"])
    source = find_mindspeed()
    if source is None:
        return Row("mindspeed", commit[:8], "-", "FAIL" if npu_present else "note")
    problems = []
    if source.commit is None:
        problems.append(f"commit unknown ({source.package_dir} is not in a git checkout)")
    elif source.commit != commit:
        problems.append(f"checkout at {source.commit[:8]}")
    if not source.registers_torch_compile:
        problems.append("no torch.compile registration in features_manager/megatron_basic/requirements_basic.py")
    if problems:
        return Row("mindspeed", commit[:8], "; ".join(problems), "FAIL")
    return Row("mindspeed", commit[:8], f"{source.commit[:8] if source.commit else ''} at {source.package_dir}", "ok")


def environment_rows(npu_present: bool) -> list[Row]:
    devices = npu_devices()
    cann = cann_version()
    expected_cann = str(pins()["cann"]["version"])
    rows = [Row("NPU devices", "16 per A3 node", f"{len(devices)}" if devices else "none", "ok" if devices else "note")]
    if cann is None:
        rows.append(Row("CANN", expected_cann, "not found", "FAIL" if npu_present else "note"))
    else:
        same = cann.replace(".", "").lower().startswith(expected_cann.replace(".", "").lower())
        rows.append(Row("CANN", expected_cann, cann, "ok" if same else "FAIL"))
    return rows


def patch_rows(*, deep: bool) -> list[Row]:
    from r1_ascend.patches import PATCHES, PatchError, check_versions
    from r1_ascend.patches.source_check import check_static

    rows = []
    if deep:
        _prepare_deep_imports()
    for spec in PATCHES:
        problems = []
        try:
            check_versions(spec)
        except PatchError as exc:
            problems.append(str(exc))
        details = []
        for target in spec.targets:
            result = _deep_check(spec.name, target) if deep else check_static(target)
            details.append(f"{target.path}: {result.detail}")
            if not result.ok:
                problems.append(f"{target.path}: {result.detail}")
        verdict = "FAIL" if problems else "ok"
        checked = sorted({d.split(": ", 1)[1] for d in details})
        found = "; ".join(problems) if problems else f"applicable ({len(details)} target(s): {', '.join(checked)})"
        rows.append(Row(spec.name, ", ".join(f"{d}=={v}" for d, v in spec.requires.items()), found, verdict))
    return rows


def _prepare_deep_imports() -> None:
    # vLLM logs its platform and plugin discovery at INFO on import; the report should not drown in it.
    if "vllm" not in sys.modules:
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")


def _deep_check(patch: str, target: Target) -> StaticResult:
    from r1_ascend.patches import PatchError, check_signature, read_target
    from r1_ascend.patches.source_check import StaticResult

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # upstream import-time warnings (no Apex, no Triton) are not findings
            value = read_target(target, patch=patch)
        if not target.is_dict_entry:
            check_signature(target, value, patch=patch)
    except PatchError as exc:
        return StaticResult(False, str(exc))
    return StaticResult(True, "resolves at run time")


def _print_table(title: str, rows: list[Row]) -> None:
    print(f"\n{title}")
    width = max(len(r.item) for r in rows)
    exp_width = max(len(r.expected) for r in rows)
    for row in rows:
        mark = {"ok": "ok  ", "note": "note", "FAIL": "FAIL"}[row.verdict]
        print(f"  [{mark}] {row.item:<{width}}  expected {row.expected:<{exp_width}}  found {row.found}")


def main(argv: list[str] | None = None) -> int:
    from r1_ascend.cli import plain_help

    parser = argparse.ArgumentParser(prog="r1-ascend doctor", description=plain_help(__doc__))
    parser.add_argument(
        "--import",
        dest="deep",
        action="store_true",
        help="also import upstream and resolve every patch target at run time (slower)",
    )
    args = parser.parse_args(argv)
    npu_present = bool(npu_devices())
    stack = stack_rows(npu_present)
    environment = environment_rows(npu_present)
    patches = patch_rows(deep=args.deep)
    print(f"r1-ascend doctor ({'NPU machine' if npu_present else 'no NPU: CPU test environment rules apply'})")
    _print_table("Pinned stack (src/r1_ascend/stack.toml)", stack)
    _print_table("Environment", environment)
    _print_table(f"Patches ({'imported' if args.deep else 'checked in upstream source'})", patches)
    failures = [r for r in (*stack, *environment, *patches) if r.verdict == "FAIL"]
    if failures:
        print(f"\n{len(failures)} problem(s):", file=sys.stderr)
        for row in failures:
            print(f"  - {row.item}: expected {row.expected}, found {row.found}", file=sys.stderr)
        print(
            "Fix: install the pinned stack (see README 'Versions'), or disable a patch with R1_ASCEND_DISABLE.",
            file=sys.stderr,
        )
        return 1
    print("\nall checks passed")
    return 0
