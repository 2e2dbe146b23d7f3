#!/usr/bin/env bash
# Environment for an r1-ascend run on Ascend NPUs, sourced by ray_start_npu.sh and the run scripts BEFORE Ray
# starts, so raylets and every Ray worker inherit it. Each variable keeps a value you exported yourself; the
# defaults and their meaning are documented in docs/environment.md. Source it, don't execute it.
# shellcheck shell=bash

# --- vLLM / vllm-ascend ---------------------------------------------------------------------------------------
export VLLM_USE_V1="${VLLM_USE_V1:-1}"                       # V1 engine (the patched rollout requires it)
export VLLM_VERSION="${VLLM_VERSION:-0.9.1}"                 # vLLM built from source reports an odd version
export VLLM_ASCEND_MODEL_EXECUTE_TIME_OBSERVE="${VLLM_ASCEND_MODEL_EXECUTE_TIME_OBSERVE:-0}"

# --- HCCL (identical on every node) -----------------------------------------------------------------------------
export HCCL_CONNECT_TIMEOUT="${HCCL_CONNECT_TIMEOUT:-600}"
export HCCL_EXEC_TIMEOUT="${HCCL_EXEC_TIMEOUT:-600}"
export HCCL_IF_BASE_PORT="${HCCL_IF_BASE_PORT:-64247}"
export HCCL_BUFFSIZE="${HCCL_BUFFSIZE:-300}"
export HCCL_OP_EXPANSION_MODE="${HCCL_OP_EXPANSION_MODE:-AIV}"

# --- torch_npu / CANN -----------------------------------------------------------------------------------------
export PYTORCH_NPU_ALLOC_CONF="${PYTORCH_NPU_ALLOC_CONF:-expandable_segments:True}"
export TASK_QUEUE_ENABLE="${TASK_QUEUE_ENABLE:-2}"
export ASCEND_LAUNCH_BLOCKING="${ASCEND_LAUNCH_BLOCKING:-0}"
export CUDA_DEVICE_MAX_CONNECTIONS="${CUDA_DEVICE_MAX_CONNECTIONS:-1}"

# --- Ray / Hydra / verl ---------------------------------------------------------------------------------------
export RAY_DEDUP_LOGS="${RAY_DEDUP_LOGS:-0}"
export RAY_USAGE_STATS_ENABLED="${RAY_USAGE_STATS_ENABLED:-0}"
export HYDRA_FULL_ERROR="${HYDRA_FULL_ERROR:-1}"
export VERL_LOGGING_LEVEL="${VERL_LOGGING_LEVEL:-WARN}"
# A worker killed from outside (the OOM killer, a device fault) leaves what it forked running: megatron-core's
# checkpoint Manager process holds the worker's sockets, so Ray never sees the worker die. The raylet adopts and
# kills such processes within 10 s (Ray's subreaper mode, Linux >= 3.4).
export RAY_kill_child_processes_on_worker_exit_with_raylet_subreaper="${RAY_kill_child_processes_on_worker_exit_with_raylet_subreaper:-true}"
# verl imports these modules in every process that imports verl: that is how the patches reach every Ray worker.
export VERL_USE_EXTERNAL_MODULES="${VERL_USE_EXTERNAL_MODULES:-r1_ascend.patches.prelude}"

# --- network interface: one name for HCCL, gloo and the rollout's DP rendezvous ---------------------------------
nic="${SOCKET_IFNAME:-${HCCL_SOCKET_IFNAME:-}}"
if [[ -n "${nic}" ]]; then
    export HCCL_SOCKET_IFNAME="${HCCL_SOCKET_IFNAME:-${nic}}"
    export GLOO_SOCKET_IFNAME="${GLOO_SOCKET_IFNAME:-${nic}}"
    export TP_SOCKET_IFNAME="${TP_SOCKET_IFNAME:-${nic}}"
fi
unset nic

# --- vLLM data-parallel size: not set here -------------------------------------------------------------------
# The vllm_dp_ep_groups patch derives VLLM_DP_SIZE = world size / rollout TP in every rollout worker, where vLLM reads
# it, and rejects an exported value that disagrees; `r1-ascend preflight` checks an exported one against the config.
