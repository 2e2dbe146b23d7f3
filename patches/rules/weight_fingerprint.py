"""The fingerprint the weight-sync check (``verl_weight_sync_check``) compares, and its rounding bound.

For an HF tensor ``X`` (``[C]`` or ``[R, C]``) the fingerprint is four sums over its elements,

- ``proj = sum a_r * b_c * x_rc``: a pseudo-random projection, with ``a`` and ``b`` drawn from the tensor's name and
  each element's *global* row and column index (:func:`row_weights`, :func:`col_weights`), so a value moved to
  another place, another tensor or another expert changes it;
- ``total = sum x``: the plain sum;
- ``abs_total = sum |x|``: what the tolerance is taken from;
- ``checksum = sum_r A_r * (sum_c B_c * bits(x_rc) mod 2^16) mod (2^31 - 1)``: the same projection over the
  elements' bit patterns (``bits``: the 16-bit words of the value, two per fp32 element) with integer keys
  (:func:`row_keys`, :func:`col_keys`), computed exactly;

and all four are linear (the checksum over the integers mod ``2^31 - 1``): the fingerprint of a tensor is the sum of
the fingerprints of any partition of it into regions (a rank's TP / EP / PP shard, the part a rollout rank owns),
whoever computes each part. A region of an HF tensor is any view of it whose last axis is a range of columns
(``[..., C']``, the leading axes its rows); the weights are the same view of ``a`` and ``b``.

**Rounding.** ``b`` takes 256 values +-[1/2, 1) exactly representable in bf16, fp16 and fp32, so ``b_c * x_rc`` is
rounded once, in the tensor's own dtype, identically wherever the same value meets the same weight; it does not
differ between two computations and is no part of the bound. ``a`` is an fp32 number of magnitude in [1/2, 1).
Each sum is one torch reduction with fp32 accumulation over the columns (in whatever order torch's kernel takes
them), then, after the multiplication by ``a`` (one rounding), one over the rows: every leaf-to-root path of
``proj`` has at most ``D = (C - 1) + 1 + (R - 1)`` roundings (``R``: the region's rows, all leading axes), and by the
standard bound for a sum computed in any order (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed.,
eq. 4.4), ``|computed - exact| <= gamma_D * sum |a_r b_c x_rc| <= gamma_D * abs_total`` with
``gamma_D = D u / (1 - D u)``, ``u = 2^-24`` (``total``: ``D - 1``). Regions are combined in float64, each fp32
result converted exactly: at most :data:`FP64_TERMS` terms in any order add ``gamma64 * abs_total`` (u = 2^-53).

Two computations of the same values in any two orders therefore differ by at most
:func:`tolerance` ``= (2 gamma_D + gamma64) * abs_total / (1 - gamma_n)`` (``abs_total`` is itself one fp32
reduction of the ``n`` elements); a larger difference is a mismatch. A change whose exact effect on a sum exceeds
twice the tolerance is always caught; one between once and twice may or may not be. Few reductions keep the cost
down (a handful of kernels per region: on a 671B rank the check fingerprints about 3,500 regions per sync), at the
price of a loose bound on large regions; the checksum below decides equality exactly.

**Why the exact checksum too.** The bound grows with the region's ``abs_total`` (``n`` elements), a change with
``sqrt`` of the elements it touches: a tensor left at the previous step's values (a bf16 training step moves a few
percent of the elements by one unit in the last place) differs from the right one by far less than the bound on
a 671B-sized tensor. Integer arithmetic is exact in any order, so the checksum needs no tolerance: the 16-bit
products wrap mod 2^16 (odd keys: a changed word always changes its product), the row sums are exact in int64 and
reduced mod the prime ``2^31 - 1``; a single changed element always changes it, several cancel with probability
about ``2^-31``. Two fingerprints match when both fp32 sums are within their bound and the checksums are equal.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    import torch

#: The fp32 and fp64 unit roundoffs (round to nearest).
UNIT_FP32 = 2.0**-24
UNIT_FP64 = 2.0**-53
#: The most fp32 region results one fingerprint is combined from in float64 (pieces x ranks), any order.
FP64_TERMS = 2**24
#: The run's fixed seed (the weights must be the same on every rank and in every sync).
SEED = 0x5EED_0F_A11_5CA1E
#: The fingerprint's fp32 sums, in the order a fingerprint tensor holds them (the checksum is a separate int64).
SUMS = ("proj", "total", "abs_total")
#: The checksum's modulus (a prime: a nonzero key times a change of one 16-bit word is never 0 mod it).
PRIME = 2**31 - 1

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def depth(shape: tuple[int, ...]) -> int:
    """Most roundings on a leaf-to-root path of ``proj`` for a region of ``shape`` (or of any region inside it):
    ``total`` has one less (no multiplication by ``a``)."""
    cols = shape[-1] if shape else 1
    rows = math.prod(shape[:-1]) if len(shape) > 1 else 1
    return (cols - 1) + 1 + (rows - 1)


def gamma(n: int, unit: float = UNIT_FP32) -> float:
    """Higham's ``gamma_n = n u / (1 - n u)``."""
    if n * unit >= 1:
        msg = f"{n} roundings of unit {unit} have no bound: the region is too large to fingerprint in fp32"
        raise ValueError(msg)
    return n * unit / (1 - n * unit)


def tolerance(abs_total: float, shape: tuple[int, ...], *, projection: bool = True) -> float:
    """The most two computations of ``proj`` (or ``total``) of the same values of a region of ``shape`` may differ,
    in any two summation orders, given the region's computed ``abs_total`` (module docstring)."""
    d = depth(shape) - (0 if projection else 1)
    n = max(1, math.prod(shape))
    return (2 * gamma(d) + gamma(FP64_TERMS, UNIT_FP64)) * abs(abs_total) / (1 - gamma(n - 1))


def _stream(name: str, axis: int, count: int) -> np.ndarray:
    """``count`` 64-bit pseudo-random integers for one axis of tensor ``name`` (SplitMix64 of the seed, the name's
    digest, the axis and the index: the same on every machine, rank and sync)."""
    import numpy as np

    digest = int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little")
    base = np.uint64((SEED ^ digest ^ (axis << 61)) & _MASK64)
    x = base + (np.arange(1, count + 1, dtype=np.uint64) * np.uint64(_GOLDEN))
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _signed_half_to_one(h: np.ndarray, bits: int) -> torch.Tensor:
    """+-[1/2, 1) from the top bit (sign) and the next ``bits`` bits (mantissa) of each of ``h``: fp32 weights."""
    import numpy as np
    import torch

    sign = np.where(h >> np.uint64(63), -1.0, 1.0)
    mantissa = ((h >> np.uint64(63 - bits)) & np.uint64((1 << bits) - 1)).astype(np.float64)
    return torch.from_numpy(sign * (0.5 + mantissa / 2.0 ** (bits + 1))).to(torch.float32)


def row_weights(name: str, rows: int) -> torch.Tensor:
    """``a`` of tensor ``name`` (fp32, CPU): +-[1/2, 1) with 22 bits of mantissa (exact in fp32)."""
    return _signed_half_to_one(_stream(name, 0, rows), 22)


def col_weights(name: str, cols: int) -> torch.Tensor:
    """``b`` of tensor ``name`` (fp32, CPU): +-[1/2, 1) with 7 bits of mantissa (exact in bf16, fp16 and fp32)."""
    return _signed_half_to_one(_stream(name, 1, cols), 7)


def col_keys(name: str, words: int) -> torch.Tensor:
    """``B`` of tensor ``name`` for ``words`` 16-bit words per row: odd int16 keys."""
    import numpy as np
    import torch

    h = _stream(name, 1, words)
    keys = (((h >> np.uint64(8)) & np.uint64(0xFFFF)) | np.uint64(1)).astype(np.uint16).view(np.int16)
    return torch.from_numpy(keys.copy())


def row_keys(name: str, rows: int) -> torch.Tensor:
    """``A`` of tensor ``name``: int64 keys in ``[1, PRIME)``."""
    import numpy as np
    import torch

    h = _stream(name, 0, rows)
    return torch.from_numpy((np.uint64(1) + (h >> np.uint64(8)) % np.uint64(PRIME - 1)).astype(np.int64))


def words(x: torch.Tensor) -> torch.Tensor:
    """The 16-bit words of ``x``'s values (a view; an element wider than 16 bits gives several along the last axis)."""
    import torch

    if x.element_size() == 2:
        return x.view(torch.int16)
    return (x if x.stride(-1) == 1 else x.contiguous()).view(torch.int16)


def checksum(x: torch.Tensor, a: torch.Tensor | None, b: torch.Tensor) -> torch.Tensor:
    """The exact checksum (int64 scalar in ``[0, PRIME)``, on ``x``'s device) of a region ``x`` with its keys: ``a``
    of shape ``x.shape[:-1]`` (None for a 1-D tensor), ``b`` one per 16-bit word of a row (:func:`words`)."""
    import torch

    bits = words(x)
    if tuple(b.shape) != tuple(bits.shape[-1:]):
        msg = f"checksum keys {tuple(b.shape)} do not fit the region's {bits.shape[-1]} words per row"
        raise ValueError(msg)
    rows = (bits * (b if b.dtype == torch.int16 else b.to(torch.int16))).sum(-1, dtype=torch.int64)  # products wrap
    if bits.shape[-1] >= 2**16:  # a row sum may exceed 2^31: reduce it before it meets a key
        rows = torch.remainder(rows, PRIME)
    if a is None:
        return torch.remainder(rows, PRIME)
    return torch.remainder(torch.remainder(rows * a, PRIME).sum(dtype=torch.int64), PRIME)


def fingerprint(x: torch.Tensor, a: torch.Tensor | None, b: torch.Tensor, *, with_abs: bool) -> torch.Tensor:
    """``[proj, total, abs_total]`` (fp32, on ``x``'s device) of a region ``x`` (``[..., C]``) with its weights:
    ``a`` of shape ``x.shape[:-1]`` (None for a 1-D tensor), ``b`` of shape ``[C]`` (in ``x``'s dtype or exactly
    convertible to it). ``abs_total`` is NaN unless ``with_abs``."""
    import torch

    if tuple(b.shape) != tuple(x.shape[-1:]) or (a is None) != (x.dim() == 1):
        msg = f"fingerprint weights {None if a is None else tuple(a.shape)} x {tuple(b.shape)} do not fit {x.shape}"
        raise ValueError(msg)
    if a is not None and tuple(a.shape) != tuple(x.shape[:-1]):
        msg = f"fingerprint row weights {tuple(a.shape)} do not fit the region's rows {tuple(x.shape[:-1])}"
        raise ValueError(msg)
    f32 = torch.float32
    rows = (x * (b if b.dtype == x.dtype else b.to(x.dtype))).sum(-1, dtype=f32)  # the product rounded in x's dtype
    proj = rows if a is None else (rows * a).sum()
    total = x.sum(dtype=f32)
    absolute = x.abs().sum(dtype=f32) if with_abs else torch.full((), math.nan, dtype=f32, device=x.device)
    return torch.stack([proj, total, absolute])


@dataclass(frozen=True)
class Difference:
    """How two fingerprints of one region compare."""

    expected: tuple[float, float, int]  # proj, total, checksum
    found: tuple[float, float, int]
    abs_total: float
    bound_proj: float
    bound_total: float

    @property
    def within_bound(self) -> bool:
        """Both fp32 sums within their rounding bound. A sum that is not finite (the region holds an inf or a NaN,
        e.g. a router bias of -inf that masks an expert) carries no rounding information: it must be the same
        non-finite value on both sides, and the exact checksum then decides (it reads the values' bits)."""
        return _sum_agrees(self.found[0], self.expected[0], self.bound_proj) and _sum_agrees(
            self.found[1], self.expected[1], self.bound_total
        )

    @property
    def matches(self) -> bool:
        return self.within_bound and self.found[2] == self.expected[2]

    def describe(self) -> str:
        off = abs(self.found[0] - self.expected[0])
        return (
            f"fingerprint expected proj {self.expected[0]:.9g}, total {self.expected[1]:.9g}, checksum "
            f"{self.expected[2]}; found proj {self.found[0]:.9g} (differs by {off:.3g}, bound {self.bound_proj:.3g}), "
            f"total {self.found[1]:.9g} (bound {self.bound_total:.3g}), checksum {self.found[2]}"
        )


def _sum_agrees(found: float, expected: float, bound: float) -> bool:
    if math.isfinite(found) and math.isfinite(expected):
        return abs(found - expected) <= bound
    return found == expected or (math.isnan(found) and math.isnan(expected))


def compare(
    expected: tuple[float, float, int], found: tuple[float, float, int], abs_total: float, shape: tuple[int, ...]
) -> Difference:
    """``found`` against ``expected`` for a region of ``shape`` whose values sum to ``abs_total`` in absolute value."""
    return Difference(
        expected=(float(expected[0]), float(expected[1]), int(expected[2])),
        found=(float(found[0]), float(found[1]), int(found[2])),
        abs_total=float(abs_total),
        bound_proj=tolerance(abs_total, shape),
        bound_total=tolerance(abs_total, shape, projection=False),
    )
