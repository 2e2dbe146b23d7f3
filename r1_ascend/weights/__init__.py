"""DeepSeek-V3 weight preparation: FP8 -> BF16, config fix, HF -> Megatron-core dist checkpoint and back, test data.

Everything streams one tensor at a time, so memory does not grow with the model. Entry points:
``r1-ascend convert-weights <step>`` (``r1_ascend.weights.cli``) or the functions below.
"""

from __future__ import annotations

from r1_ascend.weights.config_fix import fix_checkpoint
from r1_ascend.weights.dequant import convert_fp8_to_bf16, verify_bf16
from r1_ascend.weights.errors import CheckpointFormatError, OutputExistsError, WeightsError
from r1_ascend.weights.mcore_plan import Layout
from r1_ascend.weights.mcore_writer import convert_hf_to_megatron
from r1_ascend.weights.pipeline import PreparedWeights, convert_all
from r1_ascend.weights.tiny import make_tiny
from r1_ascend.weights.to_hf import convert_megatron_to_hf

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
