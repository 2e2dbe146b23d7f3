"""Root pytest configuration: make the Ascend stack importable on a CPU machine before anything else runs.

verl computes ``is_npu_available`` when it is first imported and vllm-ascend imports ``torch_npu`` at module
level, so the ``torch_npu`` stub must be in place before any test module (or plugin) imports verl or vLLM.
"""

from __future__ import annotations

import os
import signal

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from collections.abc import Iterator
from pathlib import Path

import pytest

from r1_ascend.cpu import bf16_gemm
from r1_ascend.testing import npu_stub

# Under pytest-xdist each worker would run torch with one thread per core, and two workers on two cores then fight
# over them: the checkpoint build with balanced routers took 132 s beside another against 23 s with one thread each
# (docs/benchmarks.md, "Test tiers"). Each worker, and every process it starts, gets its share of the cores, unless
# OMP_NUM_THREADS is set. Set before npu_stub.install() first imports torch, which reads it then.
_XDIST_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _XDIST_WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, len(os.sched_getaffinity(0)) // _XDIST_WORKERS)))

npu_stub.install()
bf16_gemm.install()  # as in every process of the rehearsal (r1_ascend.testing.stand_in_site)

# Hypothesis fails an example that takes over 200 ms by default: with two test workers sharing two cores beside a
# rehearsal that is load, not a bug. The time bounds that are rules (the reward's per-answer bound, a fault's stop
# bound) are asserted where they belong.
from hypothesis import settings  # noqa: E402

settings.register_profile("r1-ascend", deadline=None)
settings.load_profile("r1-ascend")


@pytest.fixture(autouse=True)
def _leave_upstream_untouched() -> Iterator[None]:
    """Whatever a test patched through the overlay (directly, or via a vLLM plugin load), put the originals back."""
    yield
    from r1_ascend.patches import forget_applied, restore_all

    restore_all()
    forget_applied()


@pytest.fixture(autouse=True)
def _child_exit_statuses_stay_readable() -> Iterator[None]:
    """A test must not leave its worker ignoring SIGCHLD: the kernel then reaps every child at once, and each later
    test's ``subprocess`` reads an exit status of 0 for a child that failed or was killed. A Ray driver started with
    Ray's subreaper mode (``RAY_kill_child_processes_on_worker_exit_with_raylet_subreaper``) sets it and keeps it
    after ``ray.shutdown()``. The default is put back, and the test that left it fails."""
    yield
    from r1_ascend.testing.child_signals import sigchld_ignored

    if sigchld_ignored():
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        pytest.fail("the test left this process ignoring SIGCHLD (later child exit statuses would read 0)")


@pytest.fixture(scope="session")
def quickstart_weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The quickstart's converted checkpoint (``hf-bf16/``, ``mcore/``, tokenizer), built once per pytest run and
    shared by its xdist workers: the first to ask builds it under a file lock, the other waits and reuses it. Its
    users only read it (the rehearsals' ``--weights``, the model-path tests); a conversion costs minutes here."""
    import fcntl

    from r1_ascend.rehearse.inputs import make_weights

    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "quickstart-weights"
    with open(f"{root}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        complete = root / "complete"
        if not complete.is_file():
            root.mkdir(exist_ok=True)
            make_weights(root)
            complete.touch()
    return root / "weights"


def pytest_report_header() -> list[str]:
    from r1_ascend.stack import installed_version

    names = ("verl", "vllm", "vllm-ascend", "megatron-core", "torch", "transformers", "ray")
    versions = ", ".join(f"{n} {installed_version(n) or 'missing'}" for n in names)
    return [f"upstream: {versions}", "torch_npu: CPU stub (no NPU), MindSpeed: fake (r1_ascend.testing)"]


#: Test modules that start Ray or a rehearsal, or look at every process on the machine (marked ``machine``): under
#: pytest-xdist (scripts/test.sh) they run one after the other in one lane, so no two rehearsals share the two cores
#: under their time bounds or see each other's processes, while the other workers take the rest.
#: The scheduler sees only test ids, hence a list; ``pytest_itemcollected`` checks it against the marker.
MACHINE_MODULES = frozenset(
    {
        "tests/launch/test_ray_start.py",
        "tests/launch/test_ray_start_leftovers.py",
        "tests/launch/test_recipe_entry.py",
        "tests/launch/test_rehearse.py",
        "tests/launch/test_rehearse_external_kill.py",
        "tests/launch/test_rehearse_faults.py",
        "tests/launch/test_rehearse_leftovers.py",
        "tests/launch/test_rehearse_moe_faults.py",
        "tests/launch/test_rehearse_rollout_fault.py",
        "tests/launch/test_rehearse_save_faults.py",
        "tests/launch/test_rehearse_verdict_boundaries.py",
        "tests/launch/test_toy_task.py",
        "tests/launch/test_upstream_checks.py",
        "tests/patches/test_worker_children.py",
        "tests/recipe/test_entrypoint.py",
        "tests/recipe/test_watchdog.py",
        "tests/recipe/test_watchdog_decisions.py",
    }
)

#: The machine modules that may run in a second lane, beside the first, when rehearsals get network namespaces of
#: their own: each of their rehearsals judges only its own run (the processes that name its Ray temp dir, its own
#: records), under bounds of minutes (a whole run, a stop within 180 s), and plants no fault a machine-wide check of
#: the other lane could mistake for its own (every Ray process of a rehearsal carries its ``RAY_TEMP_DIR``, which
#: r1_ascend.rehearse.leftovers reads as "claimed by another run"). Their own leftover checks look at every process
#: but leave out what the first lane's worker still holds (tests/launch/conftest.assert_nothing_left). The first lane
#: keeps the process faults, whose stops are timed against tighter bounds and whose verdicts count every unclaimed Ray
#: worker on the machine, the other machine-wide checks and the tests that start Ray on the host's loopback. One
#: rehearsal leaves a third of the two cores idle (it waits on its processes' start-up in turn): two lanes took the
#: full tier from 2067 to 1695-1792 s of pytest on 2 cores (docs/benchmarks.md, "Test tiers").
SECOND_LANE_MODULES = frozenset(
    {
        "tests/launch/test_rehearse.py",
        "tests/launch/test_rehearse_external_kill.py",
        "tests/launch/test_rehearse_moe_faults.py",
        "tests/launch/test_rehearse_rollout_fault.py",
        "tests/launch/test_rehearse_save_faults.py",
    }
)


def network_namespaces_available() -> bool:
    """Whether this machine lets the rehearsal give each run a network namespace (root and iproute2): without them
    two rehearsals would share the host's loopback addresses and ports, so the machine modules stay in one lane."""
    from r1_ascend.rehearse.cluster import delete_netns, make_netns

    _, name = make_netns()
    if name is None:
        return False
    delete_netns(name)
    return True


def pytest_itemcollected(item: pytest.Item) -> None:
    """A test marked ``machine`` outside :data:`MACHINE_MODULES` (or the reverse) would run beside a rehearsal."""
    module = item.nodeid.split("::", 1)[0]
    if bool(item.get_closest_marker("machine")) != (module in MACHINE_MODULES):
        msg = f"{item.nodeid}: the 'machine' marker and conftest.MACHINE_MODULES disagree; mark the module and list it"
        raise pytest.UsageError(msg)


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """pytest-xdist's scope scheduling (a module is one unit, so its module fixtures are built once), with the machine
    modules in one unit, or in two (the second lane) where rehearsals get network namespaces. The lanes go first in
    the queue, one to each worker; then the units that hold slow tests (model-path runs of tens of seconds, which
    last in the queue left one worker running alone at the end); the other units follow, largest first."""
    from xdist.scheduler import LoadScopeScheduling

    from r1_ascend.testing.slow_units import holds_slow_tests

    lanes = ("machine", "machine-2") if network_namespaces_available() else ("machine",)
    slow_units: dict[str, bool] = {}

    class MachineLanes(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            if module not in MACHINE_MODULES:
                return module
            return lanes[-1] if module in SECOND_LANE_MODULES else lanes[0]

        def _assign_work_unit(self, node: object) -> None:
            first = next((lane for lane in lanes if lane in self.workqueue), None)
            if first is None:
                first = next((unit for unit in self.workqueue if self._is_slow(unit)), None)
            if first is not None:
                self.workqueue.move_to_end(first, last=False)
            super()._assign_work_unit(node)

        def _is_slow(self, unit: str) -> bool:
            if unit not in slow_units:
                slow_units[unit] = holds_slow_tests(Path(__file__).resolve().parent / unit)
            return slow_units[unit]

    return MachineLanes(config, log)
