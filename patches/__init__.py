"""The r1-ascend overlay: documented, version-guarded, switchable monkey-patches on verl, vLLM, vllm-ascend
and MindSpeed.

Patch modules have no import side effects; ``apply_all`` (called once per process by
``r1_ascend.patches.prelude``) applies them in registry order. See README.md's patch table.
"""

from ._apply import PatchResult, Status, applied_names, apply_all, apply_one, check_versions, summary_line
from ._errors import PatchConfigError, PatchError, PatchTargetError, PatchVersionError
from ._install import get_original, install, installed_targets, patched_by, restore_all
from ._registry import PATCHES, PatchSpec, spec_by_name
from ._target import Target

__all__ = [
    "PATCHES",
    "PatchConfigError",
    "PatchError",
    "PatchResult",
    "PatchSpec",
    "PatchTargetError",
    "PatchVersionError",
    "Status",
    "Target",
    "applied_names",
    "apply_all",
    "apply_one",
    "check_versions",
    "get_original",
    "install",
    "installed_targets",
    "patched_by",
    "restore_all",
    "spec_by_name",
    "summary_line",
]
