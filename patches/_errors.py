"""Every error the patch overlay raises, in one hierarchy: ``except PatchError`` catches them all.

Every message says what failed, what was expected and how to fix it. Errors about a configuration value also derive
from ``ValueError``; the others are ``RuntimeError`` through ``PatchError``.
"""

from __future__ import annotations


class PatchError(RuntimeError):
    """Base class: a patch could not be applied, configured, or do its job."""


# --- the framework: targets, versions, switches ---------------------------------------------------------------


class PatchTargetError(PatchError):
    """An upstream target is missing or its signature drifted from the one the patch was written against."""


class PatchVersionError(PatchError):
    """The installed upstream version does not satisfy the patch's declared requirement."""


class PatchConfigError(PatchError):
    """The overlay's switches are invalid (e.g. an unknown patch name in R1_ASCEND_DISABLE)."""


# --- vllm_dp_ep_groups ----------------------------------------------------------------------------------------


class DpEpConfigError(PatchError, ValueError):
    """The rollout's parallel configuration cannot give one vLLM instance over all ranks."""


class DpEpGroupError(PatchError):
    """vLLM's parallel groups could not be built as planned."""


class NodeIpError(PatchError):
    """The node's IP address for the DP rendezvous cannot be determined without guessing."""


class PortSelectionError(PatchError):
    """No free port outside the job's reserved ranges was found."""


# --- vllm_engine_kv_cache_configs, vllm_ascend_torchair_live_params, vllm_rollout_offload ------------------------


class KVCacheConfigError(PatchError):
    """The KV-cache configs are missing or inconsistent, so caches cannot be rebuilt safely."""


class TorchairGraphConfigError(PatchError):
    """The TorchAir graph configuration cannot work with re-allocated rollout parameters."""


class RolloutConfigError(PatchError, ValueError):
    """The rollout config cannot work with the offloading rollout on vllm-ascend."""


class RolloutMemoryError(PatchError):
    """The rollout's device-memory state does not allow the requested operation."""


class WeightSyncError(PatchError):
    """Some rollout parameters were not written by ``update_weights`` after the weights were re-allocated."""


# --- verl_rollout_guard -----------------------------------------------------------------------------------------


class RolloutGuardConfigError(PatchError, ValueError):
    """The guard's settings are invalid or contradict the rollout config."""


class RolloutActorMismatchError(PatchError):
    """The rollout's log-probs disagree with the actor's by more than healthy bf16 runs ever do."""


# --- verl_rollout_model_config ------------------------------------------------------------------------------------


class RolloutModelConfigError(PatchError, ValueError):
    """The rollout engine's model configuration differs from the actor's in a field that changes the forward pass."""


# --- verl_dpskv3_group_routing ------------------------------------------------------------------------------------


class GroupRoutingConfigError(PatchError, ValueError):
    """The Megatron actor's MoE group routing would differ from the rollout engine's (DeepSeek-V3)."""


# --- verl_checkpoint_integrity ------------------------------------------------------------------------------------


class CheckpointSaveError(PatchError):
    """Writing a checkpoint failed; the message names the checkpoint that is still complete."""


class CheckpointResumeError(PatchError):
    """A resume would load an incomplete checkpoint or silently start over beside existing ones."""


# --- verl_worker_watchdog -----------------------------------------------------------------------------------------


class WatchdogConfigError(PatchError, ValueError):
    """The watchdog's settings are invalid (unknown key, a limit that would mistake a busy host for a lost worker)."""


class WorkerLostError(PatchError):
    """A training worker died, stopped answering or lost its node; the message says where, and how to resume."""
