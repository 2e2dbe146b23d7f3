#!/usr/bin/env bash
# Create (or refresh) the CPU development environment in .venv: CPU torch, the real upstream packages at the
# pinned versions (verl, vllm, vllm-ascend, megatron-core) without their CUDA/NPU dependencies, and r1-ascend
# itself in editable mode. Idempotent: does nothing when the requirement files have not changed.
#
# Usage: bash scripts/setup_cpu_env.sh            (env: PYTHON=python3.11, VENV=.venv)
set -euo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
enter_checkout

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
# pip byte-compiles the ~20k modules of the wheels (torch, vLLM, transformers, ...) one by one; they are compiled
# once at the end on every core instead (step 4). Not left to the first import: where PYTHONDONTWRITEBYTECODE is
# set, nothing would be cached and every Ray worker of a rehearsal would compile its imports again (412-428 s against
# 302 s for the quickstart's rehearsal, measured)
pip=("${venv}/bin/python" -m pip --disable-pip-version-check)
install=(install -q --no-compile)

echo "setup: [1/4] CPU torch and the import-time dependencies of the patched upstream modules"
"${pip[@]}" "${install[@]}" -c requirements/cpu-constraints.txt -r requirements/cpu-deps.txt
echo "setup: [2/4] upstream at the pinned versions (--no-deps: their declared deps are CUDA/NPU builds)"
"${pip[@]}" "${install[@]}" --no-deps -r requirements/cpu-upstream.txt
echo "setup: [3/4] r1-ascend (editable)"
"${pip[@]}" "${install[@]}" --no-deps --no-build-isolation -e .
echo "setup: [4/4] byte-compiling the installed packages (every core)"
site_packages="$("${venv}/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
# exit status 1 names files that are not Python 3 (templates, vendored Python 2 examples in some wheels); pip's own
# compile step skips those the same way
"${venv}/bin/python" -m compileall -q -j 0 "${site_packages}" >/dev/null || true

echo "${wanted}" > "${stamp}"
echo "setup: done in $(( $(date +%s) - start )) s; activate with: source ${venv}/bin/activate"
