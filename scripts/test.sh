#!/usr/bin/env bash
# Set up the CPU test environment (idempotent) and run the checks: ruff, shellcheck, pytest.
#
#   bash scripts/test.sh [pytest args]         the fast tier: every test not marked slow (no Ray cluster, no
#                                              rehearsal, no end-to-end conversion or model run)
#   bash scripts/test.sh --all [pytest args]   the full tier, what CI runs: every test, slow ones included
#
# Extra arguments go to pytest, e.g. `bash scripts/test.sh tests/patches -k offload`. Two pytest-xdist workers
# (R1_ASCEND_TEST_WORKERS, 0 for none): the tests marked `machine` (Ray, rehearsals) run one at a time in each of two
# lanes, the process faults on one worker and the other rehearsals on the other, which then takes the rest
# (conftest.py; one lane where rehearsals get no network namespace).
set -euo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
enter_checkout

tier=(-m "not slow")
if [[ "${1:-}" == "--all" ]]; then
    tier=()
    shift
fi

bash scripts/setup_cpu_env.sh

echo "test: ruff"
"${venv}/bin/ruff" check .
"${venv}/bin/ruff" format --check .

echo "test: shellcheck"
"${venv}/bin/shellcheck" scripts/*.sh .ci/run

echo "test: hadolint"
"${venv}/bin/hadolint" Dockerfile

workers="${R1_ASCEND_TEST_WORKERS:-2}"
echo "test: pytest (${tier[*]:-all tests}; ${workers} workers)"
"${venv}/bin/python" -m pytest -n "${workers}" "${tier[@]}" "$@"
