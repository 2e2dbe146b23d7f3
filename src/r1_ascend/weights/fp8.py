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


def scale_shape(shape: tuple[int, ...], block: int = BLOCK) -> tuple[int, int]:
    rows, cols = shape
    return (-(-rows // block), -(-cols // block))


def _fp8_values() -> torch.Tensor:
    """The float32 value of each of the 256 e4m3 codes (exact: every e4m3 value is a float32)."""
    return torch.arange(256, dtype=torch.uint8).view(FP8_DTYPE).to(torch.float32)


_VALUES = _fp8_values()


def check_scale_shape(weight_shape: tuple[int, ...], scale_inv: torch.Tensor, name: str, block: int) -> None:
    rows, cols = weight_shape
    want = scale_shape((rows, cols), block)
    if tuple(scale_inv.shape) != want:
        msg = (
            f"{name}: scale {name}{SCALE_SUFFIX} has shape {tuple(scale_inv.shape)}, expected {want} "
            f"(ceil of {rows}x{cols} / {block}); the checkpoint is not DeepSeek block-FP8"
        )
        raise CheckpointFormatError(msg)


def dequantize_rows(
    codes: torch.Tensor, scale_inv: torch.Tensor, row_start: int, out: torch.Tensor, *, block: int = BLOCK
) -> torch.Tensor:
    """Dequantise rows ``row_start .. row_start + len(codes)`` of an FP8 weight into ``out`` (BF16, same shape).

    Per 128-row block a 256-entry table per column block holds ``bf16(value(code) * scale)`` -- the very product
    and rounding of the elementwise rule, so the result is bit-identical -- and each element is one table lookup.
    That is several times faster on CPU than torch's own FP8 cast, and needs no float32 copy of the weight.
    ``codes`` may be float8_e4m3fn or its raw uint8 bytes.
    """
    rows, cols = codes.shape
    u8 = codes.view(torch.uint8)
    scale = scale_inv.to(torch.float32)
    n_col_blocks = scale.shape[1]
    offsets = (torch.arange(cols, dtype=torch.int32) // block) * 256
    r = 0
    while r < rows:
        row_block = (row_start + r) // block
        r1 = min(rows, (row_block + 1) * block - row_start)
        table = (_VALUES.view(1, 256) * scale[row_block].view(n_col_blocks, 1)).to(torch.bfloat16).reshape(-1)
        index = u8[r:r1].to(torch.int32)
        index += offsets
        torch.index_select(table, 0, index.view(-1), out=out[r:r1].view(-1))
        r = r1
    return out


def dequantize_fp8_blockwise(
    weight: torch.Tensor, scale_inv: torch.Tensor, *, name: str = "tensor", block: int = BLOCK
) -> torch.Tensor:
    """BF16 copy of a 2-D FP8 weight, exactly ``bf16(float32(x) * scale_inv[m // 128, n // 128])``."""
    if weight.dtype != FP8_DTYPE or weight.dim() != 2:
        msg = f"{name}: expected a 2-D float8_e4m3fn weight, got {weight.dtype} {tuple(weight.shape)}"
        raise CheckpointFormatError(msg)
    check_scale_shape(tuple(weight.shape), scale_inv, name, block)
    out = torch.empty(tuple(weight.shape), dtype=torch.bfloat16)
    return dequantize_rows(weight.contiguous(), scale_inv, 0, out, block=block)


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
