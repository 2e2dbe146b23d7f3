"""DeepSeek-V3 block-wise FP8 (e4m3, 128x128 blocks): exact dequantisation and, for test data, quantisation.

``y[m, n] = bf16(float32(x[m, n]) * scale_inv[m // 128, n // 128])``: ``scale_inv`` is the multiplier, partial edge
blocks use the scale of their real elements, and the product is rounded to BF16 exactly once, so the result is
bit-identical to DeepSeek's Triton kernel.
"""

from __future__ import annotations

import torch

from r1_ascend.weights.errors import CheckpointFormatError

BLOCK = 128
FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0
SCALE_SUFFIX = "_scale_inv"
# Rows of blocks processed per step: bounds the float32 temporaries to ~8 MiB per 1k columns.
_ROW_BLOCKS_PER_STEP = 8


def scale_shape(shape: tuple[int, ...], block: int = BLOCK) -> tuple[int, int]:
    rows, cols = shape
    return (-(-rows // block), -(-cols // block))


def dequantize_fp8_blockwise(
    weight: torch.Tensor, scale_inv: torch.Tensor, *, name: str = "tensor", block: int = BLOCK
) -> torch.Tensor:
    """BF16 copy of a 2-D FP8 weight; works in bands of rows so temporaries stay small for any tensor size."""
    if weight.dtype != FP8_DTYPE or weight.dim() != 2:
        msg = f"{name}: expected a 2-D float8_e4m3fn weight, got {weight.dtype} {tuple(weight.shape)}"
        raise CheckpointFormatError(msg)
    rows, cols = weight.shape
    want = scale_shape((rows, cols), block)
    if tuple(scale_inv.shape) != want:
        msg = (
            f"{name}: scale {name}{SCALE_SUFFIX} has shape {tuple(scale_inv.shape)}, expected {want} "
            f"(ceil of {rows}x{cols} / {block}); the checkpoint is not DeepSeek block-FP8"
        )
        raise CheckpointFormatError(msg)
    scale = scale_inv.to(torch.float32)
    out = torch.empty((rows, cols), dtype=torch.bfloat16)
    n_col_blocks = want[1]
    padded_cols = n_col_blocks * block
    step = _ROW_BLOCKS_PER_STEP * block
    for r0 in range(0, rows, step):
        r1 = min(r0 + step, rows)
        band_blocks = -(-(r1 - r0) // block)
        band = torch.zeros((band_blocks * block, padded_cols), dtype=torch.float32)
        band[: r1 - r0, :cols] = weight[r0:r1]
        band4 = band.view(band_blocks, block, n_col_blocks, block)
        band4.mul_(scale[r0 // block : r0 // block + band_blocks].view(band_blocks, 1, n_col_blocks, 1))
        out[r0:r1] = band[: r1 - r0, :cols]
    return out


def quantize_fp8_blockwise(weight: torch.Tensor, *, block: int = BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp8 weight, float32 scale_inv) as DeepSeek produces them: scale = max(amax(|block|), 1e-4) / 448."""
    rows, cols = weight.shape
    nb_r, nb_c = scale_shape((rows, cols), block)
    padded = torch.zeros((nb_r * block, nb_c * block), dtype=torch.float32)
    padded[:rows, :cols] = weight.float()
    blocks = padded.view(nb_r, block, nb_c, block)
    scale = blocks.abs().amax(dim=(1, 3)).clamp_min(1e-4) / FP8_MAX
    q = (blocks / scale.view(nb_r, 1, nb_c, 1)).clamp(-FP8_MAX, FP8_MAX)
    q = q.view(nb_r * block, nb_c * block)[:rows, :cols].to(FP8_DTYPE)
    return q.contiguous(), scale.contiguous()
