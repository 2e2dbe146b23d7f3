"""DeepSeek-V3 weight preparation: FP8 -> BF16, config fix, HF -> Megatron-core dist checkpoint and back, test data.

Everything streams one tensor at a time, so memory does not grow with the model. Entry points:
``r1-ascend convert-weights <step>`` (``r1_ascend.weights.cli``) or the functions below. They are imported on first
use, so light modules of this package (``manifest``, ``errors``) can be read without importing torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from r1_ascend.parallel import Layout
    from r1_ascend.weights.config_fix import fix_checkpoint
    from r1_ascend.weights.dequant import convert_fp8_to_bf16, verify_bf16
    from r1_ascend.weights.errors import CheckpointFormatError, OutputExistsError, WeightsError
    from r1_ascend.weights.mcore_writer import convert_hf_to_megatron
    from r1_ascend.weights.pipeline import PreparedWeights, convert_all
    from r1_ascend.weights.tiny import make_tiny
    from r1_ascend.weights.to_hf import convert_megatron_to_hf

_EXPORTS = {
    "CheckpointFormatError": "r1_ascend.weights.errors",
    "Layout": "r1_ascend.parallel",
    "OutputExistsError": "r1_ascend.weights.errors",
    "PreparedWeights": "r1_ascend.weights.pipeline",
    "WeightsError": "r1_ascend.weights.errors",
    "convert_all": "r1_ascend.weights.pipeline",
    "convert_fp8_to_bf16": "r1_ascend.weights.dequant",
    "convert_hf_to_megatron": "r1_ascend.weights.mcore_writer",
    "convert_megatron_to_hf": "r1_ascend.weights.to_hf",
    "fix_checkpoint": "r1_ascend.weights.config_fix",
    "make_tiny": "r1_ascend.weights.tiny",
    "verify_bf16": "r1_ascend.weights.dequant",
}
__all__ = [
    "CheckpointFormatError",
    "Layout",
    "OutputExistsError",
    "PreparedWeights",
    "WeightsError",
    "convert_all",
    "convert_fp8_to_bf16",
    "convert_hf_to_megatron",
    "convert_megatron_to_hf",
    "fix_checkpoint",
    "make_tiny",
    "verify_bf16",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        msg = f"module {__name__!r} has no attribute {name!r}"
        raise AttributeError(msg)
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
