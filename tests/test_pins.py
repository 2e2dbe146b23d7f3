"""One source of truth for the pinned stack: requirements files and the README agree with stack.toml."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from r1_ascend.stack import pins

REPO_ROOT = Path(__file__).resolve().parents[1]


def _requirement_pins(path: Path) -> dict[str, str]:
    found = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        match = re.fullmatch(r"([A-Za-z0-9_.\-\[\]]+)==([^\s;]+)", line)
        if match:
            found[re.sub(r"\[.*\]", "", match.group(1)).lower()] = match.group(2)
    return found


def test_cpu_upstream_packages_are_the_pinned_versions() -> None:
    """The CPU test environment installs exactly the pinned upstream releases the patches target."""
    upstream = _requirement_pins(REPO_ROOT / "requirements" / "cpu-upstream.txt")
    for dist in ("verl", "vllm", "vllm-ascend", "megatron-core", "mathruler"):
        assert upstream[dist] == pins()["packages"][dist], dist


def test_cpu_constraints_match_the_pins() -> None:
    constraints = _requirement_pins(REPO_ROOT / "requirements" / "cpu-constraints.txt")
    for dist in ("transformers", "ray", "tensordict", "numpy", "pyarrow"):
        assert constraints[dist] == pins()["packages"][dist], dist
    assert constraints["torch"] == pins()["cpu_test"]["torch"]


def _readme_version_table() -> dict[str, str]:
    text = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    match = re.search(r"<!-- version-table:start -->(.*?)<!-- version-table:end -->", text, re.S)
    assert match, "README.md has no version table between <!-- version-table:start/end --> markers"
    rows = [line for line in match.group(1).strip().splitlines() if line.startswith("|")][2:]
    table = {}
    for row in rows:
        name, version = (cell.strip().strip("`") for cell in row.strip("|").split("|")[:2])
        table[name] = version
    return table


def test_readme_version_table_is_the_pins() -> None:
    """Regenerate with `python -m r1_ascend.patches.docs versions` after changing stack.toml."""
    table = _readme_version_table()
    expected = {**pins()["packages"], "python": pins()["python"], "CANN": pins()["cann"]["version"]}
    expected["MindSpeed"] = pins()["sources"]["mindspeed"]["commit"]
    assert table == expected


@pytest.mark.parametrize("section", ["packages", "sources", "cann", "cpu_test"])
def test_stack_file_has_section(section: str) -> None:
    assert pins()[section]
