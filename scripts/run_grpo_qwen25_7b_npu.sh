#!/usr/bin/env bash
# GRPO run with recipe/config/grpo_qwen25_7b.yaml: Qwen2.5-7B on one A3 node (16 dies), HF weights, no dist checkpoint.
# Same variables and options as run_grpo_deepseekv3_npu.sh (docs/launch.md).
set -euo pipefail
export R1_ASCEND_CONFIG="${R1_ASCEND_CONFIG:-grpo_qwen25_7b}"
exec bash "$(dirname "${BASH_SOURCE[0]}")/run_grpo_deepseekv3_npu.sh" "$@"
