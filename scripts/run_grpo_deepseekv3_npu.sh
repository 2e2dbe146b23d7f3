#!/usr/bin/env bash
# Run GRPO with one of the configurations in recipe/config (default: DeepSeek-V3 671B on 16 A3 nodes).
# Multi-node: do not call this directly, run scripts/ray_start_npu.sh on every node (the head calls this script).
# Single node (smoke, Qwen2.5-7B): call it directly; verl starts a local Ray.
#
#   MODEL_PATH=... DIST_CKPT_DIR=... DATA_DIR=... bash scripts/run_grpo_deepseekv3_npu.sh [--dry-run] [key=value ...]
#
# Runs `r1-ascend preflight` on the resolved configuration first and stops on any error. --dry-run: preflight, print
# the exact training command, exit. Extra arguments are Hydra overrides for both. Variables: docs/environment.md.
set -euo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

python_bin="${PYTHON:-python3}"
config="${R1_ASCEND_CONFIG:-grpo_deepseekv3_671b}"
output_dir="${OUTPUT_DIR:-${repo_root}/outputs}"

dry_run=0
extra=()
for arg in "$@"; do
    if [[ "${arg}" == "--dry-run" ]]; then
        dry_run=1
    else
        extra+=("${arg}")
    fi
done

# shellcheck source=scripts/npu_env.sh
source "${repo_root}/scripts/npu_env.sh"
export TENSORBOARD_DIR="${TENSORBOARD_DIR:-${output_dir}/tensorboard/${config}}"

overrides=("trainer.default_local_dir=${output_dir}/checkpoints/${config}")
if [[ -n "${MODEL_PATH:-}" ]]; then
    overrides+=("actor_rollout_ref.model.path=${MODEL_PATH}")
fi
if [[ -n "${DIST_CKPT_DIR:-}" ]]; then
    overrides+=("actor_rollout_ref.actor.megatron.dist_checkpointing_path=${DIST_CKPT_DIR}")
fi
if [[ -n "${DATA_DIR:-}" ]]; then
    overrides+=("data.train_files=${DATA_DIR}/train.parquet")
    overrides+=("data.val_files=${VAL_DATA_DIR:-${DATA_DIR}}/val.parquet")
fi
if [[ -n "${NNODES:-}" ]]; then
    overrides+=("trainer.nnodes=${NNODES}")
fi
if [[ -n "${NPUS_PER_NODE:-}" ]]; then
    overrides+=("trainer.n_gpus_per_node=${NPUS_PER_NODE}")
fi
overrides+=("${extra[@]}")

if [[ "${R1_ASCEND_SKIP_PREFLIGHT:-0}" != "1" ]]; then
    "${python_bin}" -m r1_ascend.cli preflight --config "${config}" "${overrides[@]}"
fi

command=("${python_bin}" -m r1_ascend.recipe.main_grpo "--config-name=${config}" "${overrides[@]}")
if (( dry_run )); then
    echo "dry run: the training command is"
    printf '%q ' "${command[@]}"
    echo
    exit 0
fi
mkdir -p "${output_dir}"
exec "${command[@]}"
