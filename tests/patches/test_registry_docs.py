"""The registry, the patch docstrings, the patch table of docs/patches.md and the pins agree with each other."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

from r1_ascend.patches import PATCHES, PROCESSES
from r1_ascend.patches.docs import HEADINGS, patch_doc_sections, render_patch_table
from r1_ascend.stack import pins

REPO_ROOT = Path(__file__).resolve().parents[2]
PATCH_NAMES = [spec.name for spec in PATCHES]


def test_registry_names_are_unique_and_match_modules() -> None:
    assert len(set(PATCH_NAMES)) == len(PATCH_NAMES)
    for spec in PATCHES:
        assert (REPO_ROOT / "patches" / f"{spec.name}.py").is_file(), spec.name
        assert set(spec.processes) <= set(PROCESSES), spec.name
        assert spec.targets, f"{spec.name} declares no target"


@pytest.mark.parametrize("name", PATCH_NAMES)
def test_patch_docstring_has_every_heading(name: str) -> None:
    """Each patch module documents Target, Upstream, Process, Why, How, Upstream fix, Remove when, Disable."""
    sections = patch_doc_sections(f"r1_ascend.patches.{name}")
    for heading in HEADINGS:
        assert sections[heading], f"{name}: heading {heading!r} is empty"
    assert f"R1_ASCEND_DISABLE={name}" in sections["Disable"]
    assert not re.search(r"\b(eventually|someday|later|TBD|TODO)\b", sections["Remove when"], re.I), (
        f"{name}: 'Remove when' must be a checkable condition, got {sections['Remove when']!r}"
    )
    for target in next(s for s in PATCHES if s.name == name).targets:
        short = target.attribute.split("[")[0]
        assert short in sections["Target"], f"{name}: docstring Target does not mention {short}"


@pytest.mark.parametrize("name", PATCH_NAMES)
def test_patch_declared_versions_are_the_pins(name: str) -> None:
    """Every patch is written against exactly the pinned upstream versions (stack.toml)."""
    spec = next(s for s in PATCHES if s.name == name)
    for dist, version in spec.requires.items():
        assert pins()["packages"][dist] == version, f"{name} requires {dist}=={version}"
    for source, commit in spec.upstream_commits.items():
        assert pins()["sources"][source]["commit"] == commit, f"{name} targets {source}@{commit}"
    sections = patch_doc_sections(spec.module)
    for dist, version in spec.requires.items():
        assert f"{dist} {version}" in sections["Upstream"] or f"{dist}=={version}" in sections["Upstream"], (
            f"{name}: docstring Upstream does not name {dist} {version}"
        )


@pytest.mark.parametrize("name", PATCH_NAMES)
def test_patch_module_follows_the_convention(name: str) -> None:
    """One way to write a patch module: ``install_on_import`` from ``._install`` (a process patches only what it
    imports, never ``install``, which imports the target), the name from the registry, never a literal."""
    path = REPO_ROOT / "patches" / f"{name}.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    imports = {
        (node.level, node.module, alias.name)
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert (1, "_install", "install_on_import") in imports, (
        f"{name}: import install_on_import as `from ._install import install_on_import`"
    )
    assert (1, "_registry", "spec_by_module") in imports, f"{name}: take NAME from `spec_by_module(__name__)`"
    eager = {(level, module) for level, module, alias in imports if alias == "install"}
    assert not eager, f"{name}: imports the eager install ({eager}); use install_on_import"
    others = {(level, module) for level, module, alias in imports if alias == "install_on_import"} - {(1, "_install")}
    assert not others, f"{name}: install_on_import imported another way too: {others}"
    module = importlib.import_module(f"r1_ascend.patches.{name}")
    assert name == module.NAME, f"{name}: NAME is {module.NAME!r}"
    docstring = ast.get_docstring(tree, clean=False)
    literals = [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value != docstring
        if re.search(rf"\b{name}\b", node.value)
    ]
    assert not literals, f"{name}: patch name hard-coded on line(s) {literals}; use NAME or spec.name"
    assert callable(module.apply), f"{name}: no apply(spec)"


def test_inline_headings_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Headings stand alone on their line: the inline style (``Target: ...``) is an error, not a second style."""
    module = tmp_path / "r1_inline_doc_patch.py"
    module.write_text('"""Summary.\n\nTarget: something inline.\n"""\n', encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match="must stand on its own line"):
        patch_doc_sections("r1_inline_doc_patch")


def _docs_section(marker: str) -> str:
    text = (REPO_ROOT / "docs" / "patches.md").read_text(encoding="utf-8")
    match = re.search(rf"<!-- {marker}:start -->(.*?)<!-- {marker}:end -->", text, re.S)
    assert match, f"docs/patches.md has no section between <!-- {marker}:start/end --> markers"
    return match.group(1).strip()


def test_patch_table_matches_registry() -> None:
    """docs/patches.md's patch table is exactly what the registry and the docstrings generate.

    Regenerate it with `python -m r1_ascend.patches.docs` after changing a patch.
    """
    table = _docs_section("patch-table")
    assert table == render_patch_table()
    names = [line.split("|")[1].strip().strip("`") for line in table.splitlines()[2:]]
    assert names == PATCH_NAMES
