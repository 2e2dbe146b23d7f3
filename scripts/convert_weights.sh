#!/usr/bin/env bash
# Prepare DeepSeek-V3 weights for training: FP8 HF -> BF16 HF (MTP dropped, config fixed) -> Megatron dist ckpt.
# Usage: scripts/convert_weights.sh FP8_DIR OUT_DIR [extra `r1-ascend convert-weights all` options]
#   e.g. scripts/convert_weights.sh /data/DeepSeek-V3 /data/dsv3-prepared --workers 16 --pp 8 --pp-layers 6,8,8,8,8,8,8,7 --ep 8
# Rerunning the same command resumes; see docs/weights.md.
set -euo pipefail

if [[ $# -lt 2 ]]; then
  echo "usage: $0 FP8_DIR OUT_DIR [options of 'r1-ascend convert-weights all']" >&2
  exit 2
fi
src="$1"
out="$2"
shift 2

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-python3}"
if [[ -x "${repo_root}/.venv/bin/python" && -z "${PYTHON:-}" ]]; then
  python="${repo_root}/.venv/bin/python"
fi

exec "${python}" -m r1_ascend.cli convert-weights all "${src}" "${out}" "$@"
