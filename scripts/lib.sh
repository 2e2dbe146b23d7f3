# shellcheck shell=bash
# Sourced first by the scripts in this directory (never run on its own): strict mode, the repository root as both
# ${repo_root} and the working directory (wherever the script was called from), and ${venv}.
set -euo pipefail

# shellcheck disable=SC2034  # read by the scripts that source this file
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${repo_root}"
# The CPU virtual environment setup_cpu_env.sh creates and quickstart.sh / test.sh run from.
# shellcheck disable=SC2034
venv="${VENV:-.venv}"
