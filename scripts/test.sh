#!/usr/bin/env bash
# Set up the CPU test environment (idempotent) and run the checks: ruff, shellcheck, pytest.
#
#   bash scripts/test.sh [pytest args]         the fast tier: every test not marked slow (no Ray cluster, no
#                                              rehearsal, no end-to-end conversion or model run)
#   bash scripts/test.sh --all [pytest args]   the full tier, what CI runs: every test, slow ones included
#
# Extra arguments go to pytest, e.g. `bash scripts/test.sh tests/patches -k offload`. pytest-xdist workers
# (R1_ASCEND_TEST_WORKERS, 0 for none): the tests marked `machine` (Ray, rehearsals) run one at a time in each of two
# lanes, the process faults on one worker and the other rehearsals on another (conftest.py; one lane where rehearsals
# get no network namespace); the other tests go to whichever worker is free. The full tier has three workers on two
# cores: a rehearsal waits on its processes' start-up in turn and on its bounds, and a third worker fills that idle
# time with the other tests (docs/benchmarks.md, "Test tiers"); the fast tier has two.
set -euo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

tier=(-m "not slow")
default_workers=2
if [[ "${1:-}" == "--all" ]]; then
    tier=()
    default_workers=3
    shift
fi

bash scripts/setup_cpu_env.sh

echo "test: ruff"
"${venv}/bin/ruff" check .
"${venv}/bin/ruff" format --check .

echo "test: shellcheck"
"${venv}/bin/shellcheck" scripts/*.sh .ci/run

workers="${R1_ASCEND_TEST_WORKERS:-${default_workers}}"
echo "test: pytest (${tier[*]:-all tests}; ${workers} workers)"
"${venv}/bin/python" -m pytest -n "${workers}" "${tier[@]}" "$@"
