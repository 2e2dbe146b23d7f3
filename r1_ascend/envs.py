"""Every environment variable r1-ascend itself reads, with its default and meaning.

Upstream variables (``VLLM_*``, ``HCCL_*``, ``PYTORCH_NPU_ALLOC_CONF`` ...) are documented in docs/environment.md;
only the project's own switches are read here, always through these accessors (never ``os.environ[...]``).
"""

from __future__ import annotations

import os

#: "1"/"true" disables every patch (the overlay becomes a no-op; stock verl runs, which is NOT expected to work
#: on NPU for DeepSeek-V3 — useful only to bisect a problem).
R1_ASCEND_DISABLE_ALL = "R1_ASCEND_DISABLE_ALL"
#: Comma list of patch names to leave unapplied, e.g. "mindspeed_torch_compile,verl_onpolicy_logprob".
#: An unknown name is an error (typo protection).
R1_ASCEND_DISABLE = "R1_ASCEND_DISABLE"
#: Log level of the r1_ascend loggers (default WARNING; the one-line prelude summary is logged at INFO and also
#: printed to stderr once per process unless this is "ERROR" or higher).
R1_ASCEND_LOG_LEVEL = "R1_ASCEND_LOG_LEVEL"

_TRUE = {"1", "true", "yes", "on"}


def disable_all() -> bool:
    return os.environ.get(R1_ASCEND_DISABLE_ALL, "").strip().lower() in _TRUE


def disabled_patch_names() -> list[str]:
    raw = os.environ.get(R1_ASCEND_DISABLE, "")
    return [name.strip() for name in raw.split(",") if name.strip()]


def log_level() -> str:
    return os.environ.get(R1_ASCEND_LOG_LEVEL, "WARNING").strip().upper() or "WARNING"
