#!/usr/bin/env bash
# GRPO run with recipe/config/grpo_deepseekv3_smoke.yaml: one A3 node (16 dies), a 4-layer DeepSeek-V3-shaped model (r1-ascend quickstart makes it).
# Same variables and options as run_grpo_deepseekv3_npu.sh (docs/launch.md).
set -euo pipefail
export R1_ASCEND_CONFIG="${R1_ASCEND_CONFIG:-grpo_deepseekv3_smoke}"
exec bash "$(dirname "${BASH_SOURCE[0]}")/run_grpo_deepseekv3_npu.sh" "$@"
