"""pyproject lists every package and data file, so a non-editable install (the NPU image) has all of them."""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
SETUPTOOLS = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]


def _package_dir(name: str) -> Path:
    """Where setuptools finds package ``name`` under the package-dir mapping."""
    mapping: dict[str, str] = SETUPTOOLS["package-dir"]
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        prefix = ".".join(parts[:cut])
        if prefix in mapping:
            return REPO_ROOT / mapping[prefix] / Path(*parts[cut:])
    return REPO_ROOT / Path(*parts)


def test_every_python_package_is_listed() -> None:
    listed = set(SETUPTOOLS["packages"])
    found = set()
    for top, root in SETUPTOOLS["package-dir"].items():
        for init in (REPO_ROOT / root).rglob("__init__.py"):
            relative = init.parent.relative_to(REPO_ROOT / root)
            found.add(".".join([top, *relative.parts]))
    assert found - listed == set(), "add these to [tool.setuptools] packages"
    assert all(_package_dir(name).joinpath("__init__.py").is_file() for name in listed)


def test_runtime_data_files_are_package_data() -> None:
    """The Hydra configs, the stack pins and the shipped data are installed with the package."""
    patterns: dict[str, list[str]] = SETUPTOOLS["package-data"]
    needed = {
        "r1_ascend": ["stack.toml"],
        "r1_ascend.recipe": [p.name for p in (REPO_ROOT / "recipe" / "config").glob("*.yaml")],
        "r1_ascend.data": [
            *(f"sample/{p.name}" for p in (REPO_ROOT / "data" / "sample").glob("*.json")),
            *(f"val/{p.name}" for p in (REPO_ROOT / "data" / "val").glob("*.json")),
        ],
    }
    for package, files in needed.items():
        assert files, package
        for file in files:
            relative = file if package != "r1_ascend.recipe" else f"config/{file}"
            assert any(fnmatch.fnmatch(relative, pattern) for pattern in patterns[package]), (package, relative)
