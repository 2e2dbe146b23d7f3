"""The two lanes of the machine modules (conftest.py): what may run beside the process faults.

A second-lane module runs beside the first lane's fault runs, whose verdicts look at every process on the machine:
it must neither look at every process itself nor start a process the first lane's look could take for its own.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: What a module uses to look at every process on the machine, or to plant a stand-in Ray worker.
MACHINE_WIDE = ("run_processes", "process_iter", "node_daemons", '"ray::')


def _frozenset(name: str) -> frozenset[str]:
    tree = ast.parse((ROOT / "conftest.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            call = node.value
            assert isinstance(call, ast.Call), name
            return frozenset(ast.literal_eval(call.args[0]))
    raise AssertionError(f"conftest.py assigns no {name}")


def test_the_second_lane_holds_only_machine_modules_that_exist() -> None:
    second, machine = _frozenset("SECOND_LANE_MODULES"), _frozenset("MACHINE_MODULES")
    assert second <= machine
    assert second
    assert second != machine
    assert all((ROOT / module).is_file() for module in machine)


@pytest.mark.parametrize("module", sorted(_frozenset("SECOND_LANE_MODULES")))
def test_a_second_lane_module_does_not_look_at_every_process(module: str) -> None:
    source = (ROOT / module).read_text(encoding="utf-8")
    used = [name for name in MACHINE_WIDE if name in source]
    assert used == [], f"{module} uses {used}: it belongs in the first lane (conftest.MACHINE_MODULES only)"


def test_the_first_lane_keeps_the_machine_wide_looks() -> None:
    """The modules that do look at every process are machine modules of the first lane."""
    first = _frozenset("MACHINE_MODULES") - _frozenset("SECOND_LANE_MODULES")
    tests = ROOT / "tests"
    for path in sorted(tests.rglob("test_*.py")):
        module = path.relative_to(ROOT).as_posix()
        if module == Path(__file__).relative_to(ROOT).as_posix():
            continue
        source = path.read_text(encoding="utf-8")
        if any(name in source for name in ("run_processes(", "node_daemons(")):
            assert module in first, f"{module} looks at every process on the machine but is not in the first lane"
