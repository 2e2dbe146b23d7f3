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
# skips that part. --dry-run: on an Ascend node, the head's preflight and what it would start
# (ray_start_npu.sh --dry-run); on the CPU, the quickstart without the rehearsal (it already stops at the launch
# command it prints).
set -euo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
start=$(date +%s)

if compgen -G "/dev/davinci[0-9]*" >/dev/null && [[ "${R1_ASCEND_QUICKSTART_CPU:-0}" != "1" ]]; then
    echo "quickstart: Ascend NPUs found: starting the run on this node (scripts/ray_start_npu.sh)"
    exec bash "${repo_root}/scripts/ray_start_npu.sh" "$@"
fi

args=()
for arg in "$@"; do
    if [[ "${arg}" == "--dry-run" ]]; then
        export R1_ASCEND_SKIP_REHEARSAL=1
    else
        args+=("${arg}")
    fi
done
# a directory you name is read from where you called the script; the defaults are in the checkout
quickstart_dir=""
rehearse_dir=""
[[ -z "${QUICKSTART_DIR:-}" ]] || quickstart_dir="$(absolute "${QUICKSTART_DIR}")"
[[ -z "${REHEARSE_DIR:-}" ]] || rehearse_dir="$(absolute "${REHEARSE_DIR}")"
enter_checkout

echo "quickstart: no NPU on this machine: end-to-end check on the CPU with the shipped sample and a tiny model"
echo "quickstart: [setup] CPU environment (scripts/setup_cpu_env.sh)"
bash scripts/setup_cpu_env.sh
# Output directories: the commands' own defaults (outputs/quickstart, outputs/rehearse) unless set.
quickstart_args=()
[[ -z "${quickstart_dir}" ]] || quickstart_args=(--output-dir "${quickstart_dir}")
"${venv}/bin/python" -m r1_ascend.cli quickstart "${quickstart_args[@]}" "${args[@]}"
if [[ "${R1_ASCEND_SKIP_REHEARSAL:-0}" != "1" ]]; then
    echo "quickstart: [rehearse] the whole run on this machine: Ray nodes, verl's loop, kill, resume, report"
    # the rehearsal trains from the checkpoint the quickstart just converted
    rehearse_args=(--weights "${quickstart_dir:-outputs/quickstart}/weights")
    [[ -z "${rehearse_dir}" ]] || rehearse_args+=(--output-dir "${rehearse_dir}")
    "${venv}/bin/python" -m r1_ascend.cli rehearse "${rehearse_args[@]}"
fi
echo "quickstart: total $(( $(date +%s) - start )) s"
