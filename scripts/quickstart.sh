#!/usr/bin/env bash
# The first command to run: `bash scripts/quickstart.sh`.
#
# On an Ascend node (/dev/davinci* present) it is the launch: it runs scripts/ray_start_npu.sh with your environment
# (NNODES, MASTER_ADDR, SOCKET_IFNAME, MODEL_PATH, DIST_CKPT_DIR, DATA_DIR; docs/launch.md) on this node.
# On a machine without NPUs it runs the whole chain end to end on the shipped sample and a tiny model: CPU
# environment (.venv, idempotent), data preparation, synthetic checkpoint + conversion, preflight of the smoke
# configuration, and prints the exact launch command. Outputs go to QUICKSTART_DIR (default outputs/quickstart).
# Then it rehearses the whole run (`r1-ascend rehearse`: two simulated Ray nodes, verl's trainer loop, a kill in
# the middle of a step, resume, report) into REHEARSE_DIR (default outputs/rehearse); R1_ASCEND_SKIP_REHEARSAL=1
# skips that part.
set -euo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
start=$(date +%s)

if compgen -G "/dev/davinci[0-9]*" >/dev/null && [[ "${R1_ASCEND_QUICKSTART_CPU:-0}" != "1" ]]; then
    echo "quickstart: Ascend NPUs found: starting the run on this node (scripts/ray_start_npu.sh)"
    exec bash scripts/ray_start_npu.sh "$@"
fi

echo "quickstart: no NPU on this machine: end-to-end check on the CPU with the shipped sample and a tiny model"
echo "quickstart: [setup] CPU environment (scripts/setup_cpu_env.sh)"
bash scripts/setup_cpu_env.sh
# Output directories: the commands' own defaults (outputs/quickstart, outputs/rehearse) unless set.
quickstart_args=()
[[ -z "${QUICKSTART_DIR:-}" ]] || quickstart_args=(--output-dir "${QUICKSTART_DIR}")
"${venv}/bin/python" -m r1_ascend.cli quickstart "${quickstart_args[@]}" "$@"
if [[ "${R1_ASCEND_SKIP_REHEARSAL:-0}" != "1" ]]; then
    echo "quickstart: [rehearse] the whole run on this machine: Ray nodes, verl's loop, kill, resume, report"
    # the rehearsal trains from the checkpoint the quickstart just converted
    rehearse_args=(--weights "${QUICKSTART_DIR:-outputs/quickstart}/weights")
    [[ -z "${REHEARSE_DIR:-}" ]] || rehearse_args+=(--output-dir "${REHEARSE_DIR}")
    "${venv}/bin/python" -m r1_ascend.cli rehearse "${rehearse_args[@]}"
fi
echo "quickstart: total $(( $(date +%s) - start )) s"
