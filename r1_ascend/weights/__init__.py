"""DeepSeek-V3 weight preparation: FP8 -> BF16, config fix, HF -> Megatron-core dist checkpoint and back, test data.

Everything streams one tensor at a time, so memory does not grow with the model. Entry points:
``r1-ascend convert-weights <step>`` (``r1_ascend.weights.cli``) or the functions below.

The functions are imported on first use: ``fp8-to-bf16`` then starts without loading
``torch.distributed.checkpoint`` (about a second), which only the Megatron steps need.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from r1_ascend.weights.config_fix import fix_checkpoint
    from r1_ascend.weights.dequant import convert_fp8_to_bf16, verify_bf16
    from r1_ascend.weights.errors import CheckpointFormatError, OutputExistsError, WeightsError
    from r1_ascend.weights.mcore_plan import Layout
    from r1_ascend.weights.mcore_writer import convert_hf_to_megatron
    from r1_ascend.weights.pipeline import PreparedWeights, convert_all
    from r1_ascend.weights.tiny import make_tiny
    from r1_ascend.weights.to_hf import convert_megatron_to_hf

_EXPORTS = {
    "CheckpointFormatError": "errors",
    "Layout": "mcore_plan",
    "OutputExistsError": "errors",
    "PreparedWeights": "pipeline",
    "WeightsError": "errors",
    "convert_all": "pipeline",
    "convert_fp8_to_bf16": "dequant",
    "convert_hf_to_megatron": "mcore_writer",
    "convert_megatron_to_hf": "to_hf",
    "fix_checkpoint": "config_fix",
    "make_tiny": "tiny",
    "verify_bf16": "dequant",
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
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
