"""The r1-ascend overlay: documented, version-guarded, switchable monkey-patches on verl, vLLM, vllm-ascend
and MindSpeed.

Patch modules have no import side effects; ``apply_all`` (called once per process by
``r1_ascend.patches.prelude``) applies them in registry order: each target is replaced at once if its module is
imported, else right after the process imports it (``install_on_import``), so a process imports nothing to patch
it. See README.md's patch table and docs/patches.md.

The public surface: the names below (registry, installer, errors), the patch modules themselves, ``prelude``,
``rules`` (each patch's pure "what is valid" logic), ``source_check`` (targets checked in upstream source) and
``docs`` (the README tables). Modules whose name starts with ``_`` are internal: nothing outside this package
imports them (tests/test_layers.py).
"""

from ._apply import (
    PatchResult,
    Status,
    applied_names,
    apply_all,
    apply_one,
    check_targets,
    check_versions,
    forget_applied,
    summary_line,
)
from ._errors import (
    CheckpointResumeError,
    CheckpointSaveError,
    DpEpConfigError,
    DpEpGroupError,
    GroupRoutingConfigError,
    KVCacheConfigError,
    NodeIpError,
    PatchConfigError,
    PatchError,
    PatchTargetError,
    PatchVersionError,
    PortSelectionError,
    RolloutActorMismatchError,
    RolloutConfigError,
    RolloutGuardConfigError,
    RolloutMemoryError,
    RolloutModelConfigError,
    TorchairGraphConfigError,
    WatchdogConfigError,
    WeightSyncError,
    WorkerLostError,
)
from ._install import (
    get_original,
    install,
    install_on_import,
    installed_targets,
    modules_needed,
    patched_by,
    restore_all,
    waiting_targets,
)
from ._registry import PATCHES, PROCESSES, PatchSpec, spec_by_module, spec_by_name
from ._target import Target, check_signature, read_target, resolve_owner

__all__ = [
    "PATCHES",
    "PROCESSES",
    "CheckpointResumeError",
    "CheckpointSaveError",
    "DpEpConfigError",
    "DpEpGroupError",
    "GroupRoutingConfigError",
    "KVCacheConfigError",
    "NodeIpError",
    "PatchConfigError",
    "PatchError",
    "PatchResult",
    "PatchSpec",
    "PatchTargetError",
    "PatchVersionError",
    "PortSelectionError",
    "RolloutActorMismatchError",
    "RolloutConfigError",
    "RolloutGuardConfigError",
    "RolloutMemoryError",
    "RolloutModelConfigError",
    "Status",
    "Target",
    "TorchairGraphConfigError",
    "WatchdogConfigError",
    "WeightSyncError",
    "WorkerLostError",
    "applied_names",
    "apply_all",
    "apply_one",
    "check_signature",
    "check_targets",
    "check_versions",
    "forget_applied",
    "get_original",
    "install",
    "install_on_import",
    "installed_targets",
    "modules_needed",
    "patched_by",
    "read_target",
    "resolve_owner",
    "restore_all",
    "spec_by_module",
    "spec_by_name",
    "summary_line",
    "waiting_targets",
]
