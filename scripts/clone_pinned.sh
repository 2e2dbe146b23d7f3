#!/usr/bin/env bash
# Shallow-clone REF of REPO into DEST and check that HEAD is the expected commit (a full SHA, or a prefix for a tag).
# Used by the Dockerfile for every source checkout (vLLM, vllm-ascend, MindSpeed):
#
#   clone-pinned REPO REF DEST [EXPECTED_COMMIT_OR_PREFIX]      (default: REF itself, when REF is a commit)
set -euo pipefail

if [[ $# -lt 3 ]]; then
    echo "usage: clone-pinned REPO REF DEST [EXPECTED_COMMIT_OR_PREFIX]" >&2
    exit 2
fi
repo="$1"
ref="$2"
dest="$3"
want="${4:-$2}"
git init -q "${dest}"
git -C "${dest}" remote add origin "${repo}"
git -C "${dest}" fetch -q --depth 1 origin "${ref}"
git -C "${dest}" checkout -q FETCH_HEAD
got="$(git -C "${dest}" rev-parse HEAD)"
if [[ "${want}" =~ ^[0-9a-f]{7,40}$ && "${got}" != "${want}"* ]]; then
    echo "${repo}@${ref} is ${got}, expected ${want}" >&2
    exit 1
fi
echo "${repo}@${ref} -> ${got}"
