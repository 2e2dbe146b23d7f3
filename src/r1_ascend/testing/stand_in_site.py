"""What a ``sitecustomize`` of the CPU stand-ins runs: the torch_npu stub and the MindSpeed fake, installed in a
process only when it first imports torch, torch_npu or MindSpeed.

The rehearsal (and the tests' Ray clusters) put a site directory on PYTHONPATH for every process, Ray's own
daemons included (log monitor, dashboard agent, runtime-env agent, idle workers). Those never import torch;
installing the stand-ins in each of them at start-up imported torch there too: about 2 s of CPU and 150 MB apiece,
a dozen times per cluster on a 2-core machine. Deferred, only the processes that import torch pay for it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Callable, Collection, Sequence


class _FirstImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: on the first import of a trigger it leaves ``sys.meta_path`` and runs the installer,
    after torch's own module code for ``torch``, before the import for any other trigger."""

    def __init__(self, triggers: Collection[str], install: Callable[[], None]) -> None:
        self.triggers = frozenset(triggers)
        self.install = install

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.triggers:
            return None
        sys.meta_path.remove(self)
        if fullname != "torch":
            self.install()
            return importlib.util.find_spec(fullname)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        run_module = spec.loader.exec_module
        install = self.install

        def exec_then_install(module: types.ModuleType) -> None:
            run_module(module)
            install()

        spec.loader.exec_module = exec_then_install  # type: ignore[method-assign]
        return spec


def when_first_imported(triggers: Collection[str], install: Callable[[], None]) -> None:
    """Call ``install`` once, when the process first imports any of ``triggers`` (top-level names); at once if one of
    them is already imported."""
    if any(name in sys.modules for name in triggers):
        install()
        return
    sys.meta_path.insert(0, _FirstImport(triggers, install))


STAND_IN_TRIGGERS = frozenset({"torch", "torch_npu", "mindspeed"})


def _install_stand_ins() -> None:
    from r1_ascend.cpu import bf16_gemm
    from r1_ascend.testing import mindspeed_fake, npu_stub

    npu_stub.install()
    mindspeed_fake.install()
    bf16_gemm.install()


def install_stand_ins_on_first_import() -> None:
    """The stand-ins of every process that imports torch, torch_npu or MindSpeed (and the CPU's bf16 matrix products,
    r1_ascend.cpu.bf16_gemm), and nothing in any other."""
    when_first_imported(STAND_IN_TRIGGERS, _install_stand_ins)
