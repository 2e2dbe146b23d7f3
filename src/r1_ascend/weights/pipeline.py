"""The whole preparation in one call: FP8 HF -> BF16 HF (MTP dropped) -> config fix -> Megatron dist checkpoint."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict, Unpack

from r1_ascend.parallel import Layout
from r1_ascend.weights.config_fix import fix_checkpoint
from r1_ascend.weights.dequant import convert_fp8_to_bf16, verify_bf16
from r1_ascend.weights.mcore_writer import convert_hf_to_megatron

log = logging.getLogger(__name__)

BF16_SUBDIR = "hf-bf16"
MCORE_SUBDIR = "mcore"


@dataclass
class PreparedWeights:
    hf_bf16: Path  # actor_rollout_ref.model.path (config + tokenizer + BF16 weights)
    mcore: Path  # actor_rollout_ref.actor.megatron.dist_checkpointing_path (and ref.megatron.*)


class StepOptions(TypedDict, total=False):
    """Options every conversion step takes (see ``convert_fp8_to_bf16`` / ``convert_hf_to_megatron``)."""

    workers: int
    overwrite: bool
    progress: bool


def convert_all(
    src: str | Path,
    out: str | Path,
    layout: Layout | None = None,
    *,
    verify: bool = False,
    **options: Unpack[StepOptions],
) -> PreparedWeights:
    """Run every step into ``out/hf-bf16`` and ``out/mcore``; each step resumes or skips on rerun."""
    out = Path(out)
    bf16, mcore = out / BF16_SUBDIR, out / MCORE_SUBDIR
    convert_fp8_to_bf16(src, bf16, drop_mtp=True, **options)
    fix_checkpoint(bf16)
    if verify:
        verify_bf16(src, bf16, drop_mtp=True, progress=options.get("progress", True))
    convert_hf_to_megatron(bf16, mcore, layout, **options)
    if verify:
        from r1_ascend.weights.mcore_verify import verify_megatron

        verify_megatron(mcore, bf16)
    log.info("prepared weights: HF BF16 %s, Megatron %s", bf16, mcore)
    return PreparedWeights(bf16, mcore)
