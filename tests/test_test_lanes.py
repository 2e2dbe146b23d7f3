"""The two lanes of the machine modules (conftest.py): what may run beside the process faults.

A second-lane module runs beside the first lane's fault runs, whose verdicts look at every process on the machine:
it must neither look at every process itself nor start a process the first lane's look could take for its own.
"""

from __future__ import annotations

import ast
import itertools
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from r1_ascend.rehearse.process_faults import PROCESS_FAULTS

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


def _planted_faults(tree: ast.Module) -> set[str]:
    """The fault names a module hands to a rehearsal: after ``"--fault"`` in a command, as ``fault_run``'s name, or
    among a ``parametrize``'s values."""
    found: set[str] = set()
    for node in ast.walk(tree):
        items = node.args if isinstance(node, ast.Call) else getattr(node, "elts", None)
        if isinstance(items, list):
            for first, second in itertools.pairwise(items):
                if isinstance(first, ast.Constant) and first.value == "--fault" and isinstance(second, ast.Constant):
                    found.add(second.value)
        if not isinstance(node, ast.Call):
            continue
        name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
        if name == "fault_run" and len(node.args) > 1 and isinstance(node.args[1], ast.Constant):
            found.add(node.args[1].value)
        if name == "parametrize" and len(node.args) > 1:
            values = ast.walk(node.args[1])
            found |= {n.value for n in values if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    return found


def test_planted_faults_are_found_however_handed_over() -> None:
    source = textwrap.dedent(
        """
        cmd = ["rehearse", "--fault", "hang"]
        fault_run(out, "node-loss")
        @pytest.mark.parametrize("name", ["kill-rollout", ("kill-actor-worker", 1)])
        def test(name): ...
        with pytest.raises(ValueError):
            plan_for("disk-full")
        """
    )
    assert _planted_faults(ast.parse(source)) == {"hang", "node-loss", "kill-rollout", "kill-actor-worker"}


@pytest.mark.parametrize("module", sorted(_frozenset("SECOND_LANE_MODULES")))
def test_a_second_lane_module_plants_no_process_fault(module: str) -> None:
    """A process fault's own verdict counts every Ray worker on the machine that no session claims (a worker of the
    first lane's tests, caught before it opens its session logs, would be one), so process faults stay in the first
    lane."""
    planted = _planted_faults(ast.parse((ROOT / module).read_text(encoding="utf-8")))
    assert planted.isdisjoint(PROCESS_FAULTS), f"{module} plants {sorted(planted & set(PROCESS_FAULTS))}"


def test_the_other_lanes_processes_are_the_other_workers_trees(tmp_path: Path) -> None:
    """tests/launch/conftest.other_workers_processes, seen from a stand-in xdist worker: its sibling worker and what
    that forked are the other lane's; the worker itself, its own children and unrelated processes are not."""
    script = tmp_path / "controller.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import json, os, subprocess, sys, time
            sys.path.insert(0, {str(ROOT / "tests" / "launch")!r})
            if sys.argv[1:] == ["sibling"]:
                grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
                print(grandchild.pid, flush=True)
                time.sleep(60)
            elif sys.argv[1:] == ["worker"]:
                own = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
                from conftest import other_workers_processes
                print(json.dumps({{"seen": sorted(other_workers_processes()), "own": own.pid}}), flush=True)
                own.kill()
            else:
                sibling = subprocess.Popen([sys.executable, __file__, "sibling"], stdout=subprocess.PIPE, text=True)
                grandchild = int(sibling.stdout.readline())
                env = dict(os.environ, PYTEST_XDIST_WORKER="gw0")
                worker = subprocess.run([sys.executable, __file__, "worker"], env=env, capture_output=True, text=True)
                sibling.kill()
                os.kill(grandchild, 9)
                print(json.dumps({{"worker": json.loads(worker.stdout or "null"), "err": worker.stderr[-2000:],
                                  "sibling": sibling.pid, "grandchild": grandchild}}))
            """
        )
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=True)
    found = json.loads(done.stdout)
    assert found["worker"], found["err"]
    seen = set(found["worker"]["seen"])
    assert {found["sibling"], found["grandchild"]} <= seen
    assert found["worker"]["own"] not in seen
    assert seen <= {found["sibling"], found["grandchild"]}, "only the sibling's tree (no stray process of the host)"


def test_units_with_slow_tests_are_told_from_the_others_by_their_source() -> None:
    """The scheduler hands out the units holding slow tests first (conftest.py): it reads the marker from the
    module's source, as it sees only test ids."""
    from r1_ascend.testing.slow_units import holds_slow_tests

    assert holds_slow_tests(ROOT / "tests/model/test_megatron_resume.py")  # module-wide pytestmark
    assert holds_slow_tests(ROOT / "tests/launch/test_rehearse_faults.py")  # per test
    assert not holds_slow_tests(ROOT / "tests/test_test_lanes.py")
    assert not holds_slow_tests(ROOT / "tests/no_such_module.py")
