#!/usr/bin/env bash
# Set up the CPU test environment (idempotent) and run the checks CI runs: ruff, shellcheck, pytest.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh tests/patches -k offload`.
set -euo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

bash scripts/setup_cpu_env.sh

echo "test: ruff"
"${venv}/bin/ruff" check .
"${venv}/bin/ruff" format --check .

echo "test: shellcheck"
"${venv}/bin/shellcheck" scripts/*.sh .ci/run

echo "test: pytest"
"${venv}/bin/python" -m pytest "$@"
