#!/usr/bin/env bash
# Create (or refresh) the CPU development environment in .venv: CPU torch, the real upstream packages at the
# pinned versions (verl, vllm, vllm-ascend, megatron-core) without their CUDA/NPU dependencies, and r1-ascend
# itself in editable mode. Idempotent: does nothing when the requirement files have not changed.
#
# Usage: bash scripts/setup_cpu_env.sh            (env: PYTHON=python3.11, VENV=.venv)
set -euo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

python_bin="${PYTHON:-python3.11}"
stamp="${venv}/.r1-ascend-setup.sha256"

if ! command -v "${python_bin}" >/dev/null 2>&1; then
    echo "error: ${python_bin} not found; r1-ascend is pinned to Python 3.11 (set PYTHON=/path/to/python3.11)" >&2
    exit 1
fi

wanted="$(cat requirements/*.txt pyproject.toml scripts/setup_cpu_env.sh | sha256sum | cut -d' ' -f1)"
if [[ -f "${stamp}" && "$(cat "${stamp}")" == "${wanted}" ]]; then
    echo "setup: ${venv} is up to date"
    exit 0
fi

start=$(date +%s)
if [[ ! -x "${venv}/bin/python" ]]; then
    echo "setup: creating ${venv} with ${python_bin}"
    "${python_bin}" -m venv "${venv}"
fi
# --no-compile: pip would byte-compile all ~20k modules of the wheels (torch, vLLM, transformers, ...) one by one;
# Python compiles the few thousand a run imports on first import instead, and caches them the same way
pip=("${venv}/bin/python" -m pip --disable-pip-version-check)
install=(install -q --no-compile)

echo "setup: [1/3] CPU torch and the import-time dependencies of the patched upstream modules"
"${pip[@]}" "${install[@]}" -c requirements/cpu-constraints.txt -r requirements/cpu-deps.txt
echo "setup: [2/3] upstream at the pinned versions (--no-deps: their declared deps are CUDA/NPU builds)"
"${pip[@]}" "${install[@]}" --no-deps -r requirements/cpu-upstream.txt
echo "setup: [3/3] r1-ascend (editable)"
"${pip[@]}" "${install[@]}" --no-deps --no-build-isolation -e .

echo "${wanted}" > "${stamp}"
echo "setup: done in $(( $(date +%s) - start )) s; activate with: source ${venv}/bin/activate"
