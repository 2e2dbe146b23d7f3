"""Every environment variable r1-ascend's Python code reads, with its default and meaning.

Covered here: each variable that a Python module of the project reads (its own ``R1_ASCEND_*`` switches, the
launcher's ``NNODES`` / ``NPUS_PER_NODE``, and ``RAY_ADDRESS``, which the driver check interprets). Each has one
constant, named as the variable, and one accessor; code elsewhere reads them only through the accessors (never
``os.environ[...]``; ``tests/test_envs.py`` scans the code for that). Every one is also listed in
docs/environment.md.

Not covered here, and documented in docs/environment.md instead: the variables only the shell scripts read
(``MASTER_ADDR``, ``RAY_PORT``, ``REHEARSE_DIR`` ...), and upstream variables the project sets or passes through
without interpreting them itself (``VLLM_*``, ``HCCL_*``, ``PYTORCH_NPU_ALLOC_CONF``, ``RAY_enable_worker_prestart``
...). The accessors take an optional mapping so that checks can judge a launch environment other than this process's.
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
#: The overlay's switches, carried into every Ray worker's runtime env (recipe/runtime_env.py).
PATCH_SWITCHES = (R1_ASCEND_DISABLE, R1_ASCEND_DISABLE_ALL, R1_ASCEND_LOG_LEVEL)

#: The run configuration in recipe/config (preflight's ``--config`` default; the run scripts read it too).
#: Unset: the caller's default (the 671B configuration).
R1_ASCEND_CONFIG = "R1_ASCEND_CONFIG"
#: Number of nodes of the cluster, set by the launcher. Unset: not known (preflight skips the size comparison;
#: the driver check treats the run as single-node).
NNODES = "NNODES"
#: NPU dies per node, set by the launcher. Unset: not known (preflight skips the size comparison).
NPUS_PER_NODE = "NPUS_PER_NODE"
#: ``HOST:PORT`` of the Ray cluster the driver joins (exported by the head; Ray's own variable, which verl's bare
#: ``ray.init()`` follows). Unset, ``auto`` or ``local``: Ray's own choice; the driver check refuses unset with
#: ``NNODES`` > 1. The DP rendezvous also keeps clear of its port.
RAY_ADDRESS = "RAY_ADDRESS"
#: Seconds the driver keeps trying ``RAY_ADDRESS`` before failing with the address in the message.
R1_ASCEND_RAY_CONNECT_TIMEOUT = "R1_ASCEND_RAY_CONNECT_TIMEOUT"
RAY_CONNECT_TIMEOUT_DEFAULT_S = 30.0
#: The r1-ascend checkout whose ``scripts/`` the commands that start processes use (``r1-ascend rehearse`` runs
#: ``scripts/ray_start_npu.sh``). Set by the image (``/opt/r1-ascend``) and exported by the scripts. Unset: the
#: checkout the package was installed from in editable mode, if any.
R1_ASCEND_HOME = "R1_ASCEND_HOME"
#: Directory the CPU rehearsal's stand-in workers append their lifecycle records to (set by ``r1-ascend rehearse``
#: in the Ray runtime env). Unset: nothing is recorded.
R1_ASCEND_REHEARSE_DIR = "R1_ASCEND_REHEARSE_DIR"
#: Seed of the CPU rehearsal's rollout sampling (``r1-ascend rehearse --seed``; verl 0.6.1's rollout config has no
#: seed key and always passes 0 to the engine). Unset: 0.
R1_ASCEND_REHEARSE_SEED = "R1_ASCEND_REHEARSE_SEED"
#: ``NAME@SYNC``: the CPU rehearsal's rollout engine plants that fault (r1_ascend.rehearse.rollout_faults) into its
#: SYNC-th weight sync (``r1-ascend rehearse --rollout-fault``). Unset: none.
R1_ASCEND_REHEARSE_ROLLOUT_FAULT = "R1_ASCEND_REHEARSE_ROLLOUT_FAULT"
#: ``1``: the CPU rehearsal's trainer permutes each training batch's rewards across its responses before the
#: advantages (``r1-ascend rehearse --shuffle-rewards``, a control run that must not learn). Unset or ``0``: not.
R1_ASCEND_REHEARSE_SHUFFLE_REWARDS = "R1_ASCEND_REHEARSE_SHUFFLE_REWARDS"
#: ``0``: the CPU engine copies each weight sync into its transformers model directly instead of through vLLM's own
#: DeepSeek-V3 ``load_weights`` (``r1_ascend.cpu.vllm_deepseek``). Unset: through vLLM's.
R1_ASCEND_ROLLOUT_VLLM_LOADER = "R1_ASCEND_ROLLOUT_VLLM_LOADER"
#: ``native``: the CPU stand-ins leave torch's own bf16 matrix-product kernels in place. Unset or ``fp32-accumulate``:
#: bf16 operands are multiplied in fp32 and rounded once (r1_ascend.cpu.bf16_gemm).
R1_ASCEND_CPU_BF16_GEMM = "R1_ASCEND_CPU_BF16_GEMM"
#: ``dead-expert@LAYER:EXPERT``: the CPU rehearsal's actor and reference get that expert's router bias at -inf once
#: their weights are loaded, so no token is ever routed to it (``r1-ascend rehearse --fault dead-expert``). Unset:
#: none.
R1_ASCEND_REHEARSE_ACTOR_FAULT = "R1_ASCEND_REHEARSE_ACTOR_FAULT"
#: ``STAGE@STEP``: the CPU rehearsal's workers, on entering that worker stage in that training step, wait (a minute
#: at most) until the rehearsal has planted its process fault (``r1-ascend rehearse --fault``), so the fault lands
#: inside the stage however short the stage is. Unset: no wait.
R1_ASCEND_REHEARSE_HOLD = "R1_ASCEND_REHEARSE_HOLD"

_TRUE = {"1", "true", "yes", "on"}
_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _env(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if environ is None else environ


def disable_all(environ: Mapping[str, str] | None = None) -> bool:
    return _env(environ).get(R1_ASCEND_DISABLE_ALL, "").strip().lower() in _TRUE


def disabled_patch_names(environ: Mapping[str, str] | None = None) -> list[str]:
    raw = _env(environ).get(R1_ASCEND_DISABLE, "")
    return [name.strip() for name in raw.split(",") if name.strip()]


def configured_log_level(environ: Mapping[str, str] | None = None) -> int | None:
    """The numeric level named by ``R1_ASCEND_LOG_LEVEL``, or None when unset; ``ValueError`` for a bad name."""
    environ = _env(environ)
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


def patch_switches(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The overlay switches that are set, by name, exactly as given (to hand on to other processes)."""
    environ = _env(environ)
    return {name: environ[name] for name in PATCH_SWITCHES if environ.get(name) is not None}


def run_config(default: str, environ: Mapping[str, str] | None = None) -> str:
    """The run configuration named by ``R1_ASCEND_CONFIG``, else ``default``."""
    return _env(environ).get(R1_ASCEND_CONFIG, default)


def nnodes(environ: Mapping[str, str] | None = None) -> str | None:
    """``NNODES`` as given (None when unset); callers judge and report a malformed value in their own terms."""
    return _env(environ).get(NNODES)


def npus_per_node(environ: Mapping[str, str] | None = None) -> str | None:
    """``NPUS_PER_NODE`` as given (None when unset)."""
    return _env(environ).get(NPUS_PER_NODE)


def ray_address(environ: Mapping[str, str] | None = None) -> str:
    """``RAY_ADDRESS`` without surrounding blanks; "" when unset."""
    return _env(environ).get(RAY_ADDRESS, "").strip()


def ray_connect_timeout(environ: Mapping[str, str] | None = None) -> float:
    """Seconds from ``R1_ASCEND_RAY_CONNECT_TIMEOUT`` (default 30); ``ValueError`` naming the variable if malformed."""
    raw = _env(environ).get(R1_ASCEND_RAY_CONNECT_TIMEOUT, "").strip()
    if not raw:
        return RAY_CONNECT_TIMEOUT_DEFAULT_S
    try:
        return float(raw)
    except ValueError:
        msg = (
            f"{R1_ASCEND_RAY_CONNECT_TIMEOUT}={raw!r} is not a number of seconds; unset it (default 30) or give e.g. 60"
        )
        raise ValueError(msg) from None


def rehearse_seed(environ: Mapping[str, str] | None = None) -> int:
    """The rehearsal's rollout sampling seed (0 when unset)."""
    raw = _env(environ).get(R1_ASCEND_REHEARSE_SEED) or "0"
    try:
        return int(raw)
    except ValueError:
        msg = f"{R1_ASCEND_REHEARSE_SEED}={raw!r} is not an integer seed"
        raise ValueError(msg) from None


def rehearse_rollout_fault(environ: Mapping[str, str] | None = None) -> str | None:
    """The rollout fault the rehearsal's engine plants (``NAME@SYNC``), or None."""
    return _env(environ).get(R1_ASCEND_REHEARSE_ROLLOUT_FAULT) or None


def rollout_vllm_loader(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the CPU engine sends each weight sync through vLLM's own DeepSeek-V3 ``load_weights``
    (``R1_ASCEND_ROLLOUT_VLLM_LOADER``, on unless 0)."""
    raw = _env(environ).get(R1_ASCEND_ROLLOUT_VLLM_LOADER) or "1"
    if raw not in ("0", "1"):
        msg = f"{R1_ASCEND_ROLLOUT_VLLM_LOADER}={raw!r}: expected 1 (weights through vLLM's load_weights) or 0"
        raise ValueError(msg)
    return raw == "1"


def cpu_bf16_gemm(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the CPU stand-ins replace torch's bf16 matrix-product kernels (``R1_ASCEND_CPU_BF16_GEMM``, on unless
    ``native``)."""
    raw = _env(environ).get(R1_ASCEND_CPU_BF16_GEMM) or "fp32-accumulate"
    if raw not in ("fp32-accumulate", "native"):
        msg = (
            f"{R1_ASCEND_CPU_BF16_GEMM}={raw!r}: expected 'fp32-accumulate' (the default) or 'native' (torch's own "
            "bf16 kernels)"
        )
        raise ValueError(msg)
    return raw == "fp32-accumulate"


def rehearse_shuffle_rewards(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the rehearsal's trainer permutes each training batch's rewards
    (``R1_ASCEND_REHEARSE_SHUFFLE_REWARDS``)."""
    raw = _env(environ).get(R1_ASCEND_REHEARSE_SHUFFLE_REWARDS) or "0"
    if raw not in ("0", "1"):
        msg = f"{R1_ASCEND_REHEARSE_SHUFFLE_REWARDS}={raw!r}: expected 1 (permute each batch's rewards) or 0"
        raise ValueError(msg)
    return raw == "1"


def rehearse_actor_fault(environ: Mapping[str, str] | None = None) -> str | None:
    """The fault the rehearsal plants into the actor's model (``dead-expert@LAYER:EXPERT``), or None."""
    return _env(environ).get(R1_ASCEND_REHEARSE_ACTOR_FAULT) or None


def rehearse_hold(environ: Mapping[str, str] | None = None) -> tuple[str, int] | None:
    """The worker stage and training step the rehearsal's workers wait in for its fault
    (``R1_ASCEND_REHEARSE_HOLD=STAGE@STEP``), or None."""
    raw = _env(environ).get(R1_ASCEND_REHEARSE_HOLD) or ""
    if not raw:
        return None
    stage, at, step = raw.partition("@")
    if not (stage.isidentifier() and at and step.isdigit() and int(step) > 0):
        msg = f"{R1_ASCEND_REHEARSE_HOLD}={raw!r}: expected STAGE@STEP (a worker method, a step >= 1): update_actor@2"
        raise ValueError(msg)
    return stage, int(step)


def rehearse_dir(environ: Mapping[str, str] | None = None) -> str | None:
    """The rehearsal's lifecycle record directory, or None when nothing is to be recorded."""
    return _env(environ).get(R1_ASCEND_REHEARSE_DIR) or None


def project_home(environ: Mapping[str, str] | None = None) -> str | None:
    """The checkout named by ``R1_ASCEND_HOME``, or None when unset."""
    return _env(environ).get(R1_ASCEND_HOME) or None
