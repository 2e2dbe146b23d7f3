"""The suite's scheduling lists in conftest.py name real tests: a renamed test would silently leave the list."""

from __future__ import annotations

import ast
from pathlib import Path

import conftest

REPO = Path(__file__).resolve().parents[1]


def _test_functions(module: str) -> set[str]:
    tree = ast.parse((REPO / module).read_text(encoding="utf-8"))
    return {node.name for node in tree.body if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")}


def test_every_machine_module_exists() -> None:
    missing = sorted(m for m in conftest.MACHINE_MODULES if not (REPO / m).is_file())
    assert missing == []


def test_every_test_run_last_exists_in_a_machine_module() -> None:
    for nodeid in conftest.RUN_LAST:
        module, name = nodeid.split("::")
        assert module in conftest.MACHINE_MODULES, nodeid
        assert name in _test_functions(module), nodeid
