"""Every environment variable r1-ascend itself reads, with its default and meaning.

Upstream variables (``VLLM_*``, ``HCCL_*``, ``PYTORCH_NPU_ALLOC_CONF`` ...) are documented in docs/environment.md;
only the project's own switches are read here, always through these accessors (never ``os.environ[...]``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

#: "1"/"true" disables every patch (the overlay becomes a no-op; stock verl runs, which is NOT expected to work
#: on NPU for DeepSeek-V3 — useful only to bisect a problem).
R1_ASCEND_DISABLE_ALL = "R1_ASCEND_DISABLE_ALL"
#: Comma list of patch names to leave unapplied, e.g. "mindspeed_torch_compile,verl_onpolicy_logprob".
#: An unknown name is an error (typo protection).
R1_ASCEND_DISABLE = "R1_ASCEND_DISABLE"
#: Level of the ``r1_ascend`` loggers (DEBUG, INFO, WARNING, ERROR, CRITICAL), set by the prelude in every process.
#: Unset: the process's logging configuration decides (WARNING unless configured). The one-line prelude summary is
#: logged at INFO and, when INFO is not enabled, also printed to stderr once per process unless this is ERROR or higher.
R1_ASCEND_LOG_LEVEL = "R1_ASCEND_LOG_LEVEL"

_TRUE = {"1", "true", "yes", "on"}
_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def disable_all(environ: Mapping[str, str] | None = None) -> bool:
    environ = os.environ if environ is None else environ
    return environ.get(R1_ASCEND_DISABLE_ALL, "").strip().lower() in _TRUE


def disabled_patch_names(environ: Mapping[str, str] | None = None) -> list[str]:
    environ = os.environ if environ is None else environ
    raw = environ.get(R1_ASCEND_DISABLE, "")
    return [name.strip() for name in raw.split(",") if name.strip()]


def configured_log_level(environ: Mapping[str, str] | None = None) -> int | None:
    """The numeric level named by ``R1_ASCEND_LOG_LEVEL``, or None when unset; ``ValueError`` for a bad name."""
    environ = os.environ if environ is None else environ
    raw = environ.get(R1_ASCEND_LOG_LEVEL, "").strip().upper()
    if not raw:
        return None
    if raw == "WARN":
        raw = "WARNING"
    if raw not in _LEVELS:
        value = environ[R1_ASCEND_LOG_LEVEL]
        msg = f"{R1_ASCEND_LOG_LEVEL}={value!r} is not a log level; use one of {', '.join(_LEVELS)}"
        raise ValueError(msg)
    return logging.getLevelName(raw)
