# shellcheck shell=bash
# Sourced first by the scripts in this directory (never run on its own): strict mode, and the repository root as
# both ${repo_root} and the working directory, wherever the script was called from.
set -euo pipefail

# shellcheck disable=SC2034  # read by the scripts that source this file
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${repo_root}"
