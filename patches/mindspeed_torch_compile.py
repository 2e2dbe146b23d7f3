"""Use the real torch.compile while the rollout engine is built, MindSpeed's stand-in otherwise.

Target:
verl.workers.megatron_workers.ActorRolloutRefWorker._build_rollout is wrapped. Inside it, the patch
switches MindSpeed's registry entry mindspeed.patch_utils.MindSpeedPatchesManager.patches_info["torch.compile"]
off and on again (registered by mindspeed/features_manager/megatron_basic/requirements_basic.py with
dummy_compile from mindspeed/core/megatron_basic/requirements_basic.py).

Upstream:
verl 0.6.1 (ActorRolloutRefWorker._build_rollout, ActorRolloutRefWorker.__init__ calling
mindspeed.megatron_adaptor.repatch); MindSpeed f6688c61bcfe45243ee5eb34c6f013b1e06eca81; the compiler's consumer
is vllm-ascend 0.9.1 NPUModelRunner._get_torchair_lazy_compiled_model (torch.compile with the TorchAir backend).

Process:
worker — the Ray worker that holds actor, reference and rollout (verl's colocated WorkerDict).

Why:
MindSpeed replaces torch.compile with dummy_compile for the whole process so Megatron training code is never
compiled. The vLLM-Ascend rollout lives in the same process, so its TorchAir graph mode silently gets an uncompiled
model (TorchAir roughly doubles decode throughput). The predecessors swapped torch.compile without try/finally, so
a failed rollout build left the real compiler active for training.

How:
A context manager around the stock _build_rollout; every step of the switch, remove_patch included, runs
inside its try/finally. On entry it looks the registry entry up (a missing entry
or a missing MindSpeed is a PatchTargetError naming what was expected), then asks MindSpeed itself to undo the
entry (Patch.remove_patch), which puts the real torch.compile back on torch and on every non-MindSpeed module
attribute named compile that held the stand-in, so `from torch import compile` copies are covered. On exit, also
when the build raises, it registers the same stand-in again and re-applies it (Patch.apply_patch), which rebinds
every module attribute named compile that holds the real compiler — the state MindSpeed itself produces. It runs
at _build_rollout time, after the worker's __init__ has called repatch(), which re-applies the stand-in. Not
covered: references kept under other names or in closures (Megatron's jit_fuser captured at import keeps the
stand-in, which is what training wants), torch.jit.script (stays the stand-in), MindSpeed's own modules, and any
compilation vLLM-Ascend defers until after the build (a new graph size, cached-graph mode): it gets the stand-in.
If torch.compile is already the real compiler on entry (nested call, MindSpeed patch not applied) nothing changes.

Upstream fix:
none upstream; MindSpeed patches process-wide by design and verl colocates rollout and training in
one process. A MindSpeed option to scope its torch.compile replacement to Megatron modules would remove the need.

Remove when:
after importing mindspeed.megatron_adaptor at the pinned MindSpeed commit, torch.compile is
torch's own function (MindSpeedPatchesManager.patches_info has no "torch.compile" entry), or vllm-ascend's
NPUModelRunner no longer calls torch.compile for TorchAir graph mode.

Disable:
R1_ASCEND_DISABLE=mindspeed_torch_compile — _build_rollout runs unwrapped: the rollout engine is built
with MindSpeed's stand-in, so TorchAir graph mode runs uncompiled (slower decode; results unchanged). Use it on a
MindSpeed build without the "torch.compile" entry once the error has told you so.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

from ._errors import PatchTargetError
from ._install import install_on_import
from ._registry import PatchSpec, spec_by_module

logger = logging.getLogger(__name__)

#: This patch's registry name (the R1_ASCEND_DISABLE token).
NAME = spec_by_module(__name__).name

REGISTRY_KEY = "torch.compile"
_REGISTRY_PATH = 'mindspeed.patch_utils.MindSpeedPatchesManager.patches_info["torch.compile"]'
_lock = threading.RLock()


def apply(spec: PatchSpec) -> None:
    commit = spec.upstream_commits.get("mindspeed", "(unpinned)")

    def build(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def _build_rollout(self: Any, trust_remote_code: bool = False) -> Any:
            with real_torch_compile(mindspeed_commit=commit):
                return original(self, trust_remote_code)

        return _build_rollout

    install_on_import(spec.name, spec.target("ActorRolloutRefWorker._build_rollout"), build)


def mindspeed_compile_entry(*, mindspeed_commit: str = "(unpinned)") -> Any:
    """MindSpeed's ``Patch`` object for ``torch.compile``; a clear ``PatchTargetError`` if there is none."""
    fix = (
        f"Install MindSpeed at commit {mindspeed_commit} (src/r1_ascend/stack.toml; `r1-ascend doctor` checks it), or "
        f"disable this patch with R1_ASCEND_DISABLE={NAME} (the rollout then runs TorchAir uncompiled)."
    )
    try:
        patch_utils = importlib.import_module("mindspeed.patch_utils")
    except ImportError as exc:
        msg = (
            f"patch {NAME!r}: cannot import mindspeed.patch_utils ({exc}). Expected MindSpeed {mindspeed_commit} "
            f"to be loaded by verl.workers.megatron_workers (which imports mindspeed.megatron_adaptor). {fix}"
        )
        raise PatchTargetError(msg) from exc
    registry = getattr(getattr(patch_utils, "MindSpeedPatchesManager", None), "patches_info", None)
    if not isinstance(registry, dict):
        msg = f"patch {NAME!r}: mindspeed.patch_utils has no MindSpeedPatchesManager.patches_info dict. {fix}"
        raise PatchTargetError(msg)
    entry = registry.get(REGISTRY_KEY)
    if entry is None:
        present = ", ".join(sorted(registry)[:8]) or "nothing"
        msg = (
            f"patch {NAME!r}: {_REGISTRY_PATH} is missing (registered: {present}"
            f"{', ...' if len(registry) > 8 else ''}). Expected MindSpeed {mindspeed_commit} to register "
            f"dummy_compile for torch.compile when mindspeed.megatron_adaptor is imported "
            f"(mindspeed/features_manager/megatron_basic/requirements_basic.py). {fix}"
        )
        raise PatchTargetError(msg)
    return entry


@contextlib.contextmanager
def real_torch_compile(*, mindspeed_commit: str = "(unpinned)") -> Iterator[None]:
    """Within the block ``torch.compile`` is torch's compiler; afterwards MindSpeed's stand-in again, always."""
    import torch

    with _lock:
        entry = mindspeed_compile_entry(mindspeed_commit=mindspeed_commit)
        current = torch.compile
        if entry.orig_func is not None and current is entry.orig_func:
            logger.debug("patch %s: torch.compile is already torch's compiler; nothing to switch", NAME)
            yield
            return
        if not entry.is_applied or current is not entry.final_patch_func:
            msg = (
                f"patch {NAME!r}: torch.compile is {current!r}, neither MindSpeed's stand-in "
                f"({entry.final_patch_func!r}) nor torch's compiler ({entry.orig_func!r}); something else rebound "
                f"it after MindSpeed. Find that code, or disable this patch with R1_ASCEND_DISABLE={NAME}."
            )
            raise PatchTargetError(msg)
        stand_in = entry.patch_func
        # Every step of the window, including remove_patch itself (it rebinds many modules one by one and may stop
        # halfway), runs inside the try: whatever happened, the finally puts MindSpeed's stand-in back everywhere.
        try:
            entry.remove_patch()
            if torch.compile is not entry.orig_func:
                msg = f"patch {NAME!r}: MindSpeed's remove_patch left torch.compile as {torch.compile!r}"
                raise PatchTargetError(msg)
            logger.info("patch %s: real torch.compile while the rollout is built", NAME)
            yield
        finally:
            try:
                if stand_in is not None:
                    entry.set_patch_func(stand_in, force_patch=True)
            finally:
                entry.apply_patch()
                logger.info("patch %s: MindSpeed's torch.compile stand-in restored", NAME)
