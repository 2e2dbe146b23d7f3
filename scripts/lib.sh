# shellcheck shell=bash
# Sourced first by the scripts in this directory (never run on its own): strict mode, ${repo_root} (the checkout these
# scripts are in, exported as R1_ASCEND_HOME for the commands they start), ${venv}, and the helpers below. The working
# directory stays the caller's, so a relative path in a variable or an override means what it meant where the script
# was called; the scripts that work on the checkout itself (setup, tests, the CPU quickstart) call enter_checkout.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export R1_ASCEND_HOME="${repo_root}"
# The CPU virtual environment setup_cpu_env.sh creates and quickstart.sh / test.sh run from (relative: to the checkout).
# shellcheck disable=SC2034  # read by the scripts that source this file
venv="${VENV:-.venv}"

enter_checkout() { cd "${repo_root}"; }
# The scripts run Python as `python -P -m r1_ascend...`: -P (Python 3.11) keeps the working directory off sys.path, so
# a folder there never shadows the installed package whatever directory the script is called from.

die() { echo "[$(basename "$0")] error: $*" >&2; exit 1; }

# absolute PATH: PATH made absolute against the working directory (it need not exist yet).
absolute() {
    if [[ "$1" == /* ]]; then
        echo "$1"
    else
        echo "${PWD}/$1"
    fi
}

# require_override ARG: ARG is a Hydra override (key=value, +key=value, ++key=value, ~key), or the script stops.
require_override() {
    [[ "$1" =~ ^(\+\+|\+|~)?[A-Za-z_][A-Za-z0-9_.@-]*(=.*)?$ && ( "$1" == *=* || "$1" == ~* ) ]] ||
        die "'$1' is not a Hydra override; give key=value (a key the config has), +key=value (a new key) or ~key"
}

# process_start PID: the kernel's start time of PID (clock ticks since boot), or nothing when PID is not running. A
# zombie (ended, not yet reaped by its parent) is not running: it holds nothing, and where nothing reaps orphans (a
# container whose PID 1 does not, a parent that became a subreaper) it stays one for good, so `kill -0` never fails.
process_start() {
    local stat
    stat="$(cat "/proc/$1/stat" 2>/dev/null)" || return 0
    stat="${stat##*) }"  # the command name may hold spaces; the fields after it do not
    read -r -a fields <<< "${stat}"
    [[ "${fields[0]}" != Z ]] || return 0  # field 3, the state
    echo "${fields[19]}"  # field 22 of /proc/PID/stat, the 20th after the name
}

# running PID: PID is a process that has not ended (see process_start: a zombie has).
running() { [[ "$1" =~ ^[0-9]+$ && -n "$(process_start "$1")" ]]; }

# record_process FILE PID: write PID and its start time to FILE, so a recycled PID is never taken for it.
record_process() { echo "$2 $(process_start "$2")" > "$1"; }

# recorded_alive FILE: the PID recorded in FILE when that same process still runs, else nothing (status 1).
recorded_alive() {
    local pid started
    [[ -f "$1" ]] || return 1
    read -r pid started < "$1" || true
    [[ "${pid}" =~ ^[0-9]+$ && -n "${started:-}" && "$(process_start "${pid}")" == "${started}" ]] || return 1
    echo "${pid}"
}

# keep_console LOG DETACH CMD...: from here on this script's console also goes to LOG (appended; the path is printed
# first). With DETACH=1, CMD (this script and its arguments) runs again in a session of its own with its console only
# in LOG, so that it survives a closed terminal or a dropped SSH session; this call then prints its pid and exits.
# R1_ASCEND_RUN_LOG, exported, tells the commands started later that the console is already being kept.
keep_console() {
    local log="$1" detach="$2" pid
    shift 2
    mkdir -p "$(dirname "${log}")"
    export R1_ASCEND_RUN_LOG="${log}"
    if (( detach )); then
        setsid nohup "$@" >> "${log}" 2>&1 < /dev/null &
        pid=$!
        echo "detached: pid ${pid}; its console goes to ${log}"
        echo "  follow it:  tail -f ${log}"
        echo "  stop it:    kill ${pid}"
        exit 0
    fi
    # both streams into the log, each still to where it went (tee -i: a Ctrl-C reaches the run, whose last words
    # still reach the log)
    exec > >(tee -ia "${log}") 2> >(tee -ia "${log}" >&2)
    echo "log: ${log} (the console of this run, also kept there)"
}
