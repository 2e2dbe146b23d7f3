#!/usr/bin/env bash
# Start the Ray cluster for a multi-node r1-ascend run and the run on it. Run the SAME command on every node; nothing
# to hand-edit:
#
#   NNODES=16 MASTER_ADDR=10.0.0.1 SOCKET_IFNAME=enp189s0f0 OUTPUT_DIR=/shared/outputs MODEL_PATH=... \
#       DIST_CKPT_DIR=... DATA_DIR=... bash scripts/ray_start_npu.sh [start|restart|stop] [--detach] [--dry-run] \
#       [key=value ...]
#
# The node whose NIC (SOCKET_IFNAME / HCCL_SOCKET_IFNAME) carries MASTER_ADDR becomes the head: it runs the
# preflight, starts Ray, waits until NNODES x NPUS_PER_NODE NPUs have joined (RAY_WAIT_TIMEOUT; NODE_IPS names the
# nodes it waits for) and every node has shown that it sees the head's OUTPUT_DIR, then runs the training
# (R1_ASCEND_LAUNCH_CMD). Every other node joins as a worker, retrying until RAY_JOIN_TIMEOUT. Hydra overrides
# (key=value ...) go to both the preflight and the training. The head keeps its console, the training's included, in
# OUTPUT_DIR/logs/<config>-<time>.log (path printed first); --detach runs it in a session of its own, console only in
# that log, so it survives a dropped SSH session. --dry-run: the head runs the preflight and prints what it would start.
#
# `restart` relaunches the run after a failure: on the head, with Ray (and the workers joined to it) left running, it
# preflights and launches again (verl resumes from the last complete checkpoint); on a worker it says whether the node
# is still joined and joins again if it is not; where Ray is not running at all it starts as `start` does.
# `stop` stops, on this node, the run's driver and the Ray processes this script started (by the PIDs it recorded),
# and nothing else. Every process of a start (Ray's daemons, its workers and whatever they forked, orphaned or not)
# carries R1_ASCEND_RAY_START_ID in its environment: `stop`, and a start that finds the previous one gone (a node lost
# and brought back), stop what is left of it by that mark. Variables and defaults: docs/environment.md.
set -euo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

python_bin="${PYTHON:-python3}"
ray_bin="${RAY:-ray}"

log() { echo "[ray_start_npu $(date +%H:%M:%S)] $*"; }
die() { echo "[ray_start_npu] error: $*" >&2; exit 1; }

usage="bash scripts/ray_start_npu.sh [start|restart|stop] [--detach] [--dry-run] [key=value ...]"
action="start"
if [[ "${1:-}" =~ ^(start|restart|stop)$ ]]; then
    action="$1"
    shift
fi
detach=0
dry_run=0
overrides=()
for arg in "$@"; do
    case "${arg}" in
        --detach) detach=1 ;;
        --dry-run) dry_run=1 ;;
        --*) die "unknown option '${arg}'; use: ${usage}" ;;
        *)
            [[ "${action}" != stop ]] || die "stop takes no arguments; use: bash scripts/ray_start_npu.sh stop"
            [[ "${arg}" == *=* || "${arg}" == ~* ]] ||
                die "unknown action or argument '${arg}'; use: ${usage} (an override is key=value)"
            require_override "${arg}"
            overrides+=("${arg}")
            ;;
    esac
done

run_dir="${R1_ASCEND_RUN_DIR:-${repo_root}/outputs/ray/$(hostname -s)}"
mkdir -p "${run_dir}"
# The run's driver on the head: its PID and start time, and the log its console goes to.
driver_file="${run_dir}/driver.pid"

# The pids of this user's processes whose environment carries R1_ASCEND_RAY_START_ID=$1 (one per line).
processes_of_start() {
    local id="$1" environ pid
    for environ in /proc/[0-9]*/environ; do
        pid="${environ#/proc/}"
        pid="${pid%/environ}"
        [[ "${pid}" != "$$" && -O "/proc/${pid}" ]] || continue
        if grep -qzxF -- "R1_ASCEND_RAY_START_ID=${id}" "${environ}" 2>/dev/null; then
            echo "${pid}"
        fi
    done
}

# Stop every process left of the start recorded in pid file $1 (SIGTERM, then SIGKILL after 10 s): a worker whose
# raylet died is orphaned to PID 1 with what it forked, holding its NPU memory, and no longer names the session.
stop_left_of_start() {
    local pidfile="$1" id left
    id="$(cat "${pidfile%.pid}.startid" 2>/dev/null || true)"
    [[ -n "${id}" ]] || return 0
    left="$(processes_of_start "${id}")"
    [[ -n "${left}" ]] || return 0
    log "stopping what Ray start ${id} left running: ${left//$'\n'/ }"
    # shellcheck disable=SC2086 # one PID per word
    kill -TERM ${left} 2>/dev/null || true
    for _ in $(seq 1 10); do
        left="$(processes_of_start "${id}")"
        [[ -n "${left}" ]] || return 0
        sleep 1
    done
    log "still running after 10 s, killing: ${left//$'\n'/ }"
    # shellcheck disable=SC2086 # one PID per word
    kill -KILL ${left} 2>/dev/null || true
}

stop_recorded() {
    local pidfile pid session stopped=0
    for pidfile in "${run_dir}"/ray-*.pid; do
        [[ -e "${pidfile}" ]] || continue
        pid="$(cat "${pidfile}")"
        session="$(cat "${pidfile%.pid}.tempdir" 2>/dev/null || true)"
        if running "${pid}"; then
            log "stopping ray start --block (pid ${pid}); it stops the Ray processes it started"
            kill -TERM "${pid}" 2>/dev/null || true
            # up to 30 s, asked every 0.2 s: it usually ends within a second, and each rehearsal stops two nodes
            for _ in $(seq 1 150); do
                running "${pid}" || break
                sleep 0.2
            done
            running "${pid}" && kill -KILL "${pid}" 2>/dev/null || true
        fi
        # Ray processes of that start that outlived it: only ours (same user) and only under its private temp dir.
        if [[ -n "${session}" ]]; then
            local left
            left="$(pgrep -u "$(id -u)" -f -- "${session}/" || true)"
            if [[ -n "${left}" ]]; then
                log "stopping leftover Ray processes under ${session}: ${left//$'\n'/ }"
                # shellcheck disable=SC2086 # one PID per word
                kill -TERM ${left} 2>/dev/null || true
            fi
        fi
        stop_left_of_start "${pidfile}"
        rm -f "${pidfile}" "${pidfile%.pid}.tempdir" "${pidfile%.pid}.startid"
        stopped=1
    done
    (( stopped )) || log "no Ray processes recorded in ${run_dir}"
}

# The run's driver, if this node's head started one that still runs: SIGTERM, then SIGKILL after 30 s.
# The record goes once the driver is gone (a record of a driver that already ended is only removed).
stop_driver() {
    local pid
    if pid="$(recorded_alive "${driver_file}")"; then
        log "stopping the run's driver (pid ${pid}; its log: $(cat "${driver_file%.pid}.log" 2>/dev/null || echo unknown))"
        kill -TERM "${pid}" 2>/dev/null || true
        for _ in $(seq 1 150); do
            recorded_alive "${driver_file}" >/dev/null || break
            sleep 0.2
        done
        if recorded_alive "${driver_file}" >/dev/null; then
            log "the driver still runs after 30 s, killing it"
            kill -KILL "${pid}" 2>/dev/null || true
        fi
    fi
    rm -f "${driver_file}" "${driver_file%.pid}.log"
}

if [[ "${action}" == "stop" ]]; then
    stop_driver
    stop_recorded
    exit 0
fi

# --- who am I -----------------------------------------------------------------------------------------------------
NNODES="${NNODES:-1}"
NPUS_PER_NODE="${NPUS_PER_NODE:-16}"
export NNODES NPUS_PER_NODE
[[ "${NNODES}" =~ ^[1-9][0-9]*$ ]] || die "NNODES must be a positive integer, got '${NNODES}'"
[[ "${NPUS_PER_NODE}" =~ ^[1-9][0-9]*$ ]] || die "NPUS_PER_NODE must be a positive integer, got '${NPUS_PER_NODE}'"

nic="${SOCKET_IFNAME:-${HCCL_SOCKET_IFNAME:-}}"
nic_ips=()
if [[ -n "${nic}" ]]; then
    if ! ip -4 -o addr show dev "${nic}" >/dev/null 2>&1; then
        die "network interface '${nic}' (SOCKET_IFNAME/HCCL_SOCKET_IFNAME) does not exist on $(hostname -s); see: ip -4 -o addr"
    fi
    mapfile -t nic_ips < <(ip -4 -o addr show dev "${nic}" | awk '{split($4, a, "/"); print a[1]}')
fi
if [[ -n "${NODE_IP:-}" ]]; then
    node_ip="${NODE_IP}"
elif (( ${#nic_ips[@]} > 0 )); then
    node_ip="${nic_ips[0]}"
elif [[ -n "${nic}" ]]; then
    die "interface '${nic}' has no IPv4 address; set SOCKET_IFNAME to the cluster NIC or NODE_IP explicitly"
else
    die "set SOCKET_IFNAME (or HCCL_SOCKET_IFNAME) to the cluster NIC, e.g. SOCKET_IFNAME=enp189s0f0 (ip -4 -o addr lists them)"
fi
master_addr="${MASTER_ADDR:-}"
if [[ -z "${master_addr}" ]]; then
    (( NNODES == 1 )) || die "set MASTER_ADDR to the head node's IP on ${nic:-the cluster NIC} (the same value on every node)"
    master_addr="${node_ip}"
fi
role="worker"
if [[ "${master_addr}" == "${node_ip}" ]]; then
    role="head"
else
    for candidate in "${nic_ips[@]}"; do
        if [[ "${candidate}" == "${master_addr}" ]]; then
            role="head"
            node_ip="${candidate}"
        fi
    done
fi

[[ -n "${OUTPUT_DIR:-}" ]] || die "set OUTPUT_DIR on every node to one directory all nodes see (checkpoints," \
    "TensorBoard events and the run's log go there, e.g. OUTPUT_DIR=/shared/outputs; never the container's own disk)"
OUTPUT_DIR="$(absolute "${OUTPUT_DIR}")"
export OUTPUT_DIR
# The head's token and each node's mark that it sees the same OUTPUT_DIR (r1_ascend.launch.ray_cluster).
shared_dir="${OUTPUT_DIR}/.r1-ascend/cluster"

ray_port="${RAY_PORT:-6766}"
ray_address="${master_addr}:${ray_port}"
# Ray's temp dir is set on the head only; workers use the same path (so give RAY_TEMP_DIR the same value on all nodes).
temp_dir="${RAY_TEMP_DIR:-/tmp/r1-ascend-ray-${ray_port}}"
pidfile="${run_dir}/ray-${role}-${node_ip}.pid"
ray_log="${run_dir}/ray-${role}-${node_ip}.log"

# --- what runs here already ---------------------------------------------------------------------------------------
ray_alive=0
previous_gone=0
if [[ -e "${pidfile}" ]] && running "$(cat "${pidfile}")"; then
    ray_alive=1
    if [[ "${action}" == start ]] && (( ! dry_run )); then
        die "Ray is already running from this script on this node (pid $(cat "${pidfile}")). To relaunch the run on" \
            "this cluster after a failure: bash scripts/ray_start_npu.sh restart [key=value ...] (on the head; the" \
            "workers stay joined); to stop this node: bash scripts/ray_start_npu.sh stop"
    fi
elif [[ -e "${pidfile}" ]]; then
    previous_gone=1
fi
if [[ "${role}" == head ]] && (( ! dry_run )); then
    if pid="$(recorded_alive "${driver_file}")"; then
        die "the run's driver is still running on this node (pid ${pid}; log $(cat "${driver_file%.pid}.log" \
            2>/dev/null || echo unknown)); follow it with tail -f, or stop it (kill ${pid}) before a restart"
    fi
    # from here on the head's console, the training's included, is kept under OUTPUT_DIR (and with --detach only there)
    if [[ -z "${R1_ASCEND_RUN_LOG:-}" ]]; then
        keep_console "${OUTPUT_DIR}/logs/${R1_ASCEND_CONFIG:-grpo_deepseekv3_671b}-$(date +%Y%m%d-%H%M%S)-$$.log" \
            "${detach}" bash "${BASH_SOURCE[0]}" "${action}" "$@"
    fi
fi

export MASTER_ADDR="${master_addr}"
# shellcheck source=scripts/npu_env.sh
source "${repo_root}/scripts/npu_env.sh"
ulimit -n 32768 2>/dev/null || log "warning: could not raise the open-file limit to 32768 (ulimit -n is $(ulimit -n))"

log "role ${role}: node ${node_ip}${nic:+ on ${nic}}, head ${ray_address}, ${NNODES} node(s) x ${NPUS_PER_NODE} NPUs," \
    "VLLM_DP_SIZE=${VLLM_DP_SIZE:-unset}, Ray temp dir ${temp_dir}"

extra_args=()
if [[ -n "${RAY_START_EXTRA_ARGS:-}" ]]; then
    read -r -a extra_args <<< "${RAY_START_EXTRA_ARGS}"
fi
common_args=(
    --node-ip-address="${node_ip}"
    --resources="{\"NPU\": ${NPUS_PER_NODE}}"
    --disable-usage-stats
    --block
)
if [[ -n "${RAY_NUM_CPUS:-}" ]]; then
    common_args+=(--num-cpus="${RAY_NUM_CPUS}")
fi


start_ray() {
    # `ray start --block` stays in the foreground as the parent of every Ray process it starts; killing it (stop)
    # stops exactly those. It runs detached from this shell so the node keeps serving after the script ends. Its
    # environment marks every process of this start, the ones it outlives included (stop_left_of_start).
    local start_id
    start_id="${node_ip}-${ray_port}-$(date +%s%N)-$$"
    R1_ASCEND_RAY_START_ID="${start_id}" \
        nohup "${ray_bin}" start "$@" "${common_args[@]}" "${extra_args[@]}" >> "${ray_log}" 2>&1 < /dev/null &
    echo "$!" > "${pidfile}"
    echo "${temp_dir}" > "${pidfile%.pid}.tempdir"
    echo "${start_id}" > "${pidfile%.pid}.startid"
}

if (( previous_gone && ! dry_run )); then
    # the previous start's `ray start` is gone without `stop` (its node was lost: the raylet killed or crashed):
    # what it left (workers orphaned to PID 1, what they forked) would keep the NPUs this start needs
    log "the previous Ray start on this node (pid $(cat "${pidfile}")) ended without stop"
    stop_left_of_start "${pidfile}"
fi

preflight_default="bash ${repo_root}/scripts/run_grpo_deepseekv3_npu.sh --dry-run"
launch_default="bash ${repo_root}/scripts/run_grpo_deepseekv3_npu.sh"
preflight_cmd=()
if [[ -n "${R1_ASCEND_PREFLIGHT_CMD-${preflight_default}}" ]]; then
    read -r -a preflight_cmd <<< "${R1_ASCEND_PREFLIGHT_CMD-${preflight_default}}"
    preflight_cmd+=("${overrides[@]}")
fi
read -r -a launch_cmd <<< "${R1_ASCEND_LAUNCH_CMD:-${launch_default}}"
launch_cmd+=("${overrides[@]}")

if (( dry_run )); then
    if [[ "${role}" == head ]]; then
        if (( ${#preflight_cmd[@]} )); then
            log "preflight: ${preflight_cmd[*]}"
            "${preflight_cmd[@]}" || die "preflight failed; fix the reported problems before taking the cluster"
        fi
        log "dry run: this node would start the Ray head at ${ray_address}, wait for ${NNODES} x ${NPUS_PER_NODE}" \
            "NPUs and every node's mark under ${shared_dir}, then run: ${launch_cmd[*]}"
    else
        log "dry run: this node would join the Ray head at ${ray_address} and mark ${shared_dir} as seen from ${node_ip}"
    fi
    exit 0
fi

if [[ "${role}" == head ]]; then
    if (( ${#preflight_cmd[@]} )); then
        log "preflight: ${preflight_cmd[*]}"
        "${preflight_cmd[@]}" || die "preflight failed; fix the reported problems before taking the cluster"
    fi
    if (( ray_alive )); then
        log "restart: keeping the Ray head (pid $(cat "${pidfile}"), log ${ray_log}) and the nodes joined to it"
    else
        [[ "${action}" == start ]] || log "restart: Ray is not running on this node; starting it as start does"
        # a fresh token: each node marks it to show it sees this OUTPUT_DIR (checked below, before the launch)
        "${python_bin}" -P -m r1_ascend.launch.ray_cluster token --shared-dir "${shared_dir}" ||
            die "cannot write under OUTPUT_DIR=${OUTPUT_DIR}; it must be writable on every node"
        dashboard=(--include-dashboard=false)
        if [[ "${RAY_DASHBOARD:-0}" == "1" ]]; then
            dashboard=(--include-dashboard=true --dashboard-host="${node_ip}" --dashboard-port="${RAY_DASHBOARD_PORT:-8260}")
        fi
        # Connect only once this node's raylet is up: a driver connecting earlier finds no local raylet and can hang.
        # `ray start --head` gives up when its GCS answers too late (a loaded node); such a start is tried again, up to
        # RAY_HEAD_START_ATTEMPTS in all, each failure reported with the end of Ray's log.
        head_start_timeout="${RAY_HEAD_START_TIMEOUT:-300}"
        head_attempts="${RAY_HEAD_START_ATTEMPTS:-2}"
        [[ "${head_attempts}" =~ ^[1-9][0-9]*$ ]] || die "RAY_HEAD_START_ATTEMPTS must be a positive integer, got '${head_attempts}'"
        head_deadline=$(( $(date +%s) + head_start_timeout ))
        for (( head_attempt = 1; ; head_attempt++ )); do
            log_lines=0
            if [[ -f "${ray_log}" ]]; then
                log_lines="$(wc -l < "${ray_log}")"
            fi
            start_ray --head --port="${ray_port}" --temp-dir="${temp_dir}" "${dashboard[@]}"
            head_started=0
            while (( $(date +%s) < head_deadline )); do
                if grep -q "Ray runtime started" < <(tail -n "+$(( log_lines + 1 ))" "${ray_log}" 2>/dev/null); then
                    head_started=1
                    break
                fi
                running "$(cat "${pidfile}")" || break
                sleep 0.2
            done
            (( head_started )) && break
            if running "$(cat "${pidfile}")"; then
                die "the Ray head did not start within ${head_start_timeout} s; see ${ray_log}"
            fi
            log "ray start --head (attempt ${head_attempt} of ${head_attempts}) exited; the end of ${ray_log}:" >&2
            { tail -n "+$(( log_lines + 1 ))" "${ray_log}" 2>/dev/null | tail -n 20 | sed 's/^/    /' >&2; } || true
            stop_left_of_start "${pidfile}"
            rm -f "${pidfile}" "${pidfile%.pid}.startid"
            (( head_attempt < head_attempts )) || die "ray start --head exited ${head_attempts} times; see ${ray_log}"
            (( $(date +%s) < head_deadline )) || die "ray start --head exited and ${head_start_timeout} s have passed; see ${ray_log}"
        done
    fi
    wait_timeout="${RAY_WAIT_TIMEOUT:-1800}"
    started="started"
    (( ! ray_alive )) || started="kept"
    log "${started} Ray head (pid $(cat "${pidfile}"), log ${ray_log}); waiting for ${NNODES} x ${NPUS_PER_NODE} NPUs" \
        "(timeout ${wait_timeout} s)"
    if ! "${python_bin}" -P -m r1_ascend.launch.ray_cluster wait --address "${ray_address}" --node-ip "${node_ip}" \
        --nodes "${NNODES}" --npus-per-node "${NPUS_PER_NODE}" --expected-ips "${NODE_IPS:-}" \
        --timeout "${wait_timeout}" --report-every "${RAY_REPORT_EVERY:-30}" \
        --watch-pid "$(cat "${pidfile}")" --log "${ray_log}" --shared-dir "${shared_dir}"; then
        die "the Ray cluster did not assemble (see above); Ray keeps running, stop it with: bash scripts/ray_start_npu.sh stop"
    fi
    log "launching: ${launch_cmd[*]}"
    export R1_ASCEND_SKIP_PREFLIGHT=1  # already done above, against the same environment
    # verl's run_ppo calls ray.init() with no address: without RAY_ADDRESS, Ray looks only under its default temp
    # dir and would start a one-node local cluster instead of joining this one.
    export RAY_ADDRESS="${ray_address}"
    # this process becomes the driver (exec): `restart` and `stop` find it by this record
    record_process "${driver_file}" "$$"
    echo "${R1_ASCEND_RUN_LOG:-}" > "${driver_file%.pid}.log"
    exec "${launch_cmd[@]}"
fi

# mark_shared: show the head that this node sees its OUTPUT_DIR; a node that does not leaves the cluster.
mark_shared() {
    if ! "${python_bin}" -P -m r1_ascend.launch.ray_cluster mark --shared-dir "${shared_dir}" --node-ip "${node_ip}" \
        --timeout "${RAY_SHARED_TIMEOUT:-60}"; then
        kill -TERM "$(cat "${pidfile}")" 2>/dev/null || true
        die "this node does not see the head's OUTPUT_DIR (${OUTPUT_DIR}); mount the shared file system at the same" \
            "path on every node; this node left the Ray cluster"
    fi
}

if (( ray_alive )); then
    if "${python_bin}" -P -m r1_ascend.launch.ray_cluster joined --address "${ray_address}" --node-ip "${node_ip}" \
        --npus-per-node "${NPUS_PER_NODE}" --timeout "${RAY_JOIN_ATTEMPT_TIMEOUT:-60}" \
        --watch-pid "$(cat "${pidfile}")" --log "${ray_log}"; then
        mark_shared
        log "restart: this worker is still joined to ${ray_address} (ray start pid $(cat "${pidfile}")); nothing to" \
            "restart here, the head relaunches the run"
        exit 0
    fi
    log "restart: this worker's Ray (pid $(cat "${pidfile}")) is no longer joined to ${ray_address}; joining again"
    stop_recorded
fi

join_timeout="${RAY_JOIN_TIMEOUT:-1800}"
retry_interval="${RAY_RETRY_INTERVAL:-5}"
join_deadline=$(( $(date +%s) + join_timeout ))
attempt=0
while :; do
    attempt=$(( attempt + 1 ))
    start_ray --address="${ray_address}"
    if "${python_bin}" -P -m r1_ascend.launch.ray_cluster joined --address "${ray_address}" --node-ip "${node_ip}" \
        --npus-per-node "${NPUS_PER_NODE}" --timeout "${RAY_JOIN_ATTEMPT_TIMEOUT:-60}" \
        --watch-pid "$(cat "${pidfile}")" --log "${ray_log}"; then
        mark_shared
        log "joined the Ray cluster at ${ray_address} (pid $(cat "${pidfile}"), log ${ray_log}); the head runs the training"
        exit 0
    fi
    pid="$(cat "${pidfile}")"
    kill -TERM "${pid}" 2>/dev/null || true
    for _ in $(seq 1 20); do
        running "${pid}" || break
        sleep 1
    done
    stop_left_of_start "${pidfile}"
    rm -f "${pidfile}" "${pidfile%.pid}.startid"
    if (( $(date +%s) >= join_deadline )); then
        die "could not join the Ray head at ${ray_address} within ${join_timeout} s (${attempt} attempts);" \
            "is the head started, is MASTER_ADDR right, is port ${ray_port} reachable from ${node_ip}? log: ${ray_log}"
    fi
    log "attempt ${attempt} failed; retrying in ${retry_interval} s"
    sleep "${retry_interval}"
done
