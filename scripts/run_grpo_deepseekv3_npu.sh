#!/usr/bin/env bash
# Run GRPO with one of the configurations in recipe/config (default: DeepSeek-V3 671B on 16 A3 nodes).
# Multi-node: do not call this directly, run scripts/ray_start_npu.sh on every node (the head calls this script).
# Single node (smoke, Qwen2.5-7B): call it directly; verl starts a local Ray.
#
#   OUTPUT_DIR=/shared/outputs MODEL_PATH=... DIST_CKPT_DIR=... DATA_DIR=... \
#       bash scripts/run_grpo_deepseekv3_npu.sh [--dry-run] [--detach] [key=value ...]
#
# Runs `r1-ascend preflight` on the resolved configuration first and stops on any error. OUTPUT_DIR is required
# (checkpoints, TensorBoard and the run's console log go there; on a cluster, a directory every node sees). The
# console is kept in OUTPUT_DIR/logs/<config>-<time>.log as well as shown; --detach runs the whole job in a session of
# its own with its console only in that log, so a dropped SSH session does not end it. --dry-run: preflight, print
# the exact training command, exit. Extra arguments are Hydra overrides, passed to both preflight and the training.
# Relative paths are read from the directory you call it from. Variables: docs/environment.md.
set -euo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

python_bin="${PYTHON:-python3}"
config="${R1_ASCEND_CONFIG:-grpo_deepseekv3_671b}"

dry_run=0
detach=0
extra=()
for arg in "$@"; do
    case "${arg}" in
        --dry-run) dry_run=1 ;;
        --detach) detach=1 ;;
        --*) die "unknown option '${arg}'; options: --dry-run, --detach, then Hydra overrides (key=value ...)" ;;
        *)
            require_override "${arg}"
            extra+=("${arg}")
            ;;
    esac
done

[[ -n "${OUTPUT_DIR:-}" ]] || die "set OUTPUT_DIR to where the run's checkpoints, TensorBoard events and console log" \
    "go (on a cluster: a directory every node sees, e.g. OUTPUT_DIR=/shared/outputs; never the container's own disk)"
output_dir="$(absolute "${OUTPUT_DIR}")"

# shellcheck source=scripts/npu_env.sh
source "${repo_root}/scripts/npu_env.sh"
TENSORBOARD_DIR="$(absolute "${TENSORBOARD_DIR:-${output_dir}/tensorboard/${config}}")"
export TENSORBOARD_DIR

overrides=("trainer.default_local_dir=${output_dir}/checkpoints/${config}")
if [[ -n "${MODEL_PATH:-}" ]]; then
    overrides+=("actor_rollout_ref.model.path=$(absolute "${MODEL_PATH}")")
fi
if [[ -n "${DIST_CKPT_DIR:-}" ]]; then
    overrides+=("actor_rollout_ref.actor.megatron.dist_checkpointing_path=$(absolute "${DIST_CKPT_DIR}")")
fi
if [[ -n "${DATA_DIR:-}" ]]; then
    overrides+=("data.train_files=$(absolute "${DATA_DIR}")/train.parquet")
    overrides+=("data.val_files=$(absolute "${VAL_DATA_DIR:-${DATA_DIR}}")/val.parquet")
fi
if [[ -n "${NNODES:-}" ]]; then
    overrides+=("trainer.nnodes=${NNODES}")
fi
if [[ -n "${NPUS_PER_NODE:-}" ]]; then
    overrides+=("trainer.n_gpus_per_node=${NPUS_PER_NODE}")
fi
# yours last: Hydra takes the last value given for a key
overrides+=("${extra[@]}")

if (( ! dry_run )) && [[ -z "${R1_ASCEND_RUN_LOG:-}" ]]; then
    keep_console "${output_dir}/logs/${config}-$(date +%Y%m%d-%H%M%S)-$$.log" "${detach}" bash "${BASH_SOURCE[0]}" "$@"
fi

if [[ "${R1_ASCEND_SKIP_PREFLIGHT:-0}" != "1" ]]; then
    "${python_bin}" -P -m r1_ascend.cli preflight --config "${config}" "${overrides[@]}"
fi

command=("${python_bin}" -P -m r1_ascend.recipe.main_grpo "--config-name=${config}" "${overrides[@]}")
if (( dry_run )); then
    echo "dry run: the training command is"
    printf '%q ' "${command[@]}"
    echo
    exit 0
fi
mkdir -p "${output_dir}"
echo "run: checkpoints in ${output_dir}/checkpoints/${config} (resumed from the last complete one, if any)"
echo "run: TensorBoard events in ${TENSORBOARD_DIR} (tensorboard --logdir ${TENSORBOARD_DIR})"
echo "run: afterwards, r1-ascend report ${output_dir}"
exec "${command[@]}"
