"""The weight-sync check's fingerprint (``rules/weight_fingerprint.py``): linear over any partition of a tensor,
exactly order-independent in its checksum, and its fp32 sums within the stated rounding bound in every summation
order, with the comparison flipping exactly at that bound."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from r1_ascend.patches.impl.weight_ownership import Region
from r1_ascend.patches.rules import weight_fingerprint as fp

NAME = "model.layers.1.mlp.experts.3.gate_proj.weight"


def _print(x: torch.Tensor, name: str, region: Region, shape: tuple[int, ...]) -> tuple[torch.Tensor, int]:
    """A region's fingerprint with the tensor's weights and keys (what the check computes)."""
    per = x.element_size() // 2
    a = region.row_weights(fp.row_weights(name, shape[0]) if len(shape) == 2 else None)
    b = region.col_weights(fp.col_weights(name, shape[-1]))
    keys = region.row_weights(fp.row_keys(name, shape[0]) if len(shape) == 2 else None)
    c0, c1 = region.cols
    check = fp.checksum(x, keys, fp.col_keys(name, shape[-1] * per)[c0 * per : c1 * per])
    return fp.fingerprint(x, a, b, with_abs=True).double(), int(check)


def _whole(x: torch.Tensor) -> Region:
    return Region((0, x.shape[0]), (0, x.shape[1])) if x.dim() == 2 else Region(None, (0, x.shape[0]))


def _combined(parts: list[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, int]:
    return sum(p for p, _ in parts), sum(c for _, c in parts) % fp.PRIME


def test_the_weights_are_exact_in_every_dtype_and_away_from_zero() -> None:
    a, b = fp.row_weights(NAME, 4096), fp.col_weights(NAME, 4096)
    for weights in (a, b):
        assert weights.abs().min() >= 0.5
        assert weights.abs().max() < 1
    for dtype in (torch.bfloat16, torch.float16):
        assert torch.equal(b.to(dtype).float(), b), "b * x is rounded once, in x's dtype, wherever it is computed"
    assert len(set(b.tolist())) > 200
    keys = fp.col_keys(NAME, 4096)
    assert keys.dtype == torch.int16
    assert bool((keys.int() % 2 != 0).all()), "odd keys: a changed 16-bit word always changes its product"
    rows = fp.row_keys(NAME, 4096)
    assert int(rows.min()) >= 1
    assert int(rows.max()) < fp.PRIME
    assert torch.equal(fp.row_weights(NAME, 10), fp.row_weights(NAME, 4096)[:10]), "index-wise, any length"
    assert not torch.equal(fp.col_weights(NAME, 64), fp.col_weights(NAME.replace("gate", "up"), 64))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_tensor_is_the_sum_of_its_parts(dtype: torch.dtype) -> None:
    """Row blocks (TP of a column-parallel layer), column blocks (a row-parallel one), heads split into two parts
    (MLA's nope / v rows): the parts' fingerprints add up to the whole's, the checksum exactly."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(96, 160, generator=g).to(dtype)
    shape = tuple(x.shape)
    whole, check = _print(x, NAME, _whole(x), shape)
    tol = fp.tolerance(float(whole[2]), shape)
    for parts in (
        [Region((0, 48), (0, 160)), Region((48, 96), (0, 160))],
        [Region((0, 96), (0, 64)), Region((0, 96), (64, 160))],
        [Region((0, 96), (0, 160), 24, (0, 16)), Region((0, 96), (0, 160), 24, (16, 24))],
    ):
        summed, summed_check = _combined([_print(r.of(x), NAME, r, shape) for r in parts])
        assert summed_check == check
        assert abs(float(summed[0] - whole[0])) <= tol
        assert abs(float(summed[1] - whole[1])) <= fp.tolerance(float(whole[2]), shape, projection=False)


def test_every_reordering_stays_within_the_bound() -> None:
    """The same values summed by other trees (every column split, a shuffle of the parts' order in float64) never
    differ by more than the stated bound, so a healthy sync never trips it; the ratio is far below 1 in practice."""
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(256, 448, generator=g) * torch.logspace(-3, 3, 448)).to(torch.bfloat16)  # wide magnitudes
    shape = tuple(x.shape)
    whole, check = _print(x, NAME, _whole(x), shape)
    worst = 0.0
    for parts in (3, 7, 28, 112):
        edges = [round(i * 448 / parts) for i in range(parts + 1)]
        regions = [Region((0, 256), (lo, hi)) for lo, hi in itertools.pairwise(edges)]
        prints = [_print(r.of(x), NAME, r, shape) for r in regions]
        for order in (prints, prints[::-1]):
            summed, summed_check = _combined(order)
            diff = fp.compare(
                (*whole[:2].tolist(), check), (*summed[:2].tolist(), summed_check), float(whole[2]), shape
            )
            assert diff.matches, diff.describe()
            worst = max(worst, abs(diff.found[0] - diff.expected[0]) / diff.bound_proj)
    assert worst < 1


def test_the_comparison_flips_exactly_at_the_bound() -> None:
    """Found a hair above the bound: a mismatch; a hair below: within it (the float part; the checksums equal)."""
    shape = (64, 128)
    bound, bound_total = fp.tolerance(1000.0, shape), fp.tolerance(1000.0, shape, projection=False)
    for factor, inside in ((1 + 1e-6, False), (1 - 1e-6, True)):
        diff = fp.compare((10.0, 5.0, 7), (10.0 + bound * factor, 5.0, 7), 1000.0, shape)
        assert diff.within_bound is inside
        assert diff.matches is inside
        diff = fp.compare((10.0, 5.0, 7), (10.0, 5.0 - bound_total * factor, 7), 1000.0, shape)
        assert diff.matches is inside
    assert not fp.compare((10.0, 5.0, 7), (10.0, 5.0, 8), 1000.0, shape).matches, "checksums must be equal"
    assert not fp.compare((10.0, 5.0, 7), (math.nan, 5.0, 7), 1000.0, shape).matches


def test_a_perturbation_just_above_twice_the_bound_is_caught_by_the_float_sums() -> None:
    """One element set from 0 to a power of two, so ``proj`` moves by exactly ``a_r * b_c * t``: just above twice
    the bound the fp32 sums alone flag it (the bound's guarantee: each side errs by at most half of it); just below
    the bound they pass it, and the exact checksum catches it."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(64, 128, generator=g).to(torch.bfloat16)
    x[5, 7] = 0
    shape = tuple(x.shape)
    base, check = _print(x, NAME, _whole(x), shape)
    bound = fp.tolerance(float(base[2]), shape)
    bound_total = fp.tolerance(float(base[2]), shape, projection=False)
    weight = abs(float(fp.row_weights(NAME, 64)[5]) * float(fp.col_weights(NAME, 128)[7]))
    above = 2 ** math.ceil(math.log2(2 * bound / weight))  # weight * t in (2 bound, 4 bound]
    below = 2 ** (math.ceil(math.log2(min(bound / weight, bound_total))) - 1)  # proj and total within half to once
    for t, float_catches in ((above, True), (below, False)):
        y = x.clone()
        y[5, 7] = t
        moved, moved_check = _print(y, NAME, _whole(y), shape)
        diff = fp.compare((*base[:2].tolist(), check), (*moved[:2].tolist(), moved_check), float(base[2]), shape)
        assert diff.within_bound is not float_catches, (t * weight / bound, diff.describe())
        assert not diff.matches, "the checksum catches what the bound lets through"


def test_the_checksum_sees_every_single_changed_bit_and_no_reordering() -> None:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(32, 48, generator=g).to(torch.bfloat16)
    shape = tuple(x.shape)
    _, check = _print(x, NAME, _whole(x), shape)
    bits = x.view(torch.int16)
    for index in torch.randint(0, x.numel(), (64,), generator=g).tolist():
        flipped = bits.clone().flatten()
        flipped[index] ^= 1  # the lowest mantissa bit of one element: a bf16 step of one unit in the last place
        y = flipped.view(shape).view(torch.bfloat16)
        assert _print(y, NAME, _whole(y), shape)[1] != check, index
    swapped = x.clone()
    swapped[[3, 4]] = x[[4, 3]]
    assert _print(swapped, NAME, _whole(swapped), shape)[1] != check, "a permutation moves values to other weights"
    transposed = x.t().contiguous().view(shape)
    assert _print(transposed, NAME, _whole(transposed), shape)[1] != check


@pytest.mark.parametrize("special", [-math.inf, math.inf, math.nan])
def test_a_region_holding_a_non_finite_value_is_decided_by_the_checksum(special: float) -> None:
    """A router bias of -inf (an expert masked on purpose) or a NaN synced exactly matches, in any split; a change of
    any other element, or the special value moved or replaced, does not."""
    name = "model.layers.2.mlp.gate.e_score_correction_bias"
    bias = torch.linspace(-1, 1, 16, dtype=torch.float32)
    bias[0] = special
    shape = (16,)
    whole, check = _print(bias, name, Region(None, (0, 16)), shape)
    summed, summed_check = _combined(
        [_print(bias[lo:hi], name, Region(None, (lo, hi)), shape) for lo, hi in ((0, 7), (7, 16))]
    )
    assert fp.compare(
        (*whole[:2].tolist(), check), (*summed[:2].tolist(), summed_check), float(whole[2]), shape
    ).matches
    changed = [bias.clone() for _ in range(3)]
    changed[0][5] += 0.25
    changed[1][[0, 3]] = bias[[3, 0]]
    changed[2][0] = 0.0 if not math.isnan(special) else math.inf
    for other in changed:
        found, found_check = _print(other, name, Region(None, (0, 16)), shape)
        diff = fp.compare((*whole[:2].tolist(), check), (*found[:2].tolist(), found_check), float(whole[2]), shape)
        assert not diff.matches, diff.describe()
    assert not fp.compare((-math.inf, 1.0, 7), (math.nan, 1.0, 7), math.inf, shape).matches
    assert not fp.compare((math.inf, 1.0, 7), (-math.inf, 1.0, 7), math.inf, shape).matches
    assert not fp.compare((1.0, 1.0, 7), (math.inf, 1.0, 7), 10.0, shape).matches


def test_a_one_dimensional_tensor_and_a_cast() -> None:
    """A 1-D tensor (a norm, the router's bias) has column weights only; a float32 tensor has two words per value;
    a cast to bf16 fingerprints the rounded values (what vLLM holds)."""
    bias = torch.linspace(-1, 1, 16, dtype=torch.float32)
    name = "model.layers.1.mlp.gate.e_score_correction_bias"
    full, check = _print(bias, name, Region(None, (0, 16)), (16,))
    parts = [_print(bias[lo:hi], name, Region(None, (lo, hi)), (16,)) for lo, hi in ((0, 5), (5, 16))]
    assert _combined(parts)[1] == check
    assert abs(float(_combined(parts)[0][0] - full[0])) <= fp.tolerance(float(full[2]), (16,))
    rounded = bias.to(torch.bfloat16)
    assert _print(rounded, name, Region(None, (0, 16)), (16,))[1] != check


def test_a_region_too_large_for_a_bound_is_refused() -> None:
    with pytest.raises(ValueError, match="too large"):
        fp.gamma(2**25)
    assert fp.depth((7168,)) == 7168, "7167 additions along the columns and the multiplication by a"
    assert fp.depth((2048, 7168)) == 7167 + 1 + 2047
    assert fp.depth((4, 3, 7)) == 6 + 1 + 11, "all leading axes are rows"


def test_a_mismatch_names_both_fingerprints_figure_by_figure() -> None:
    """The message a WeightSyncError carries: each of the six figures in its place, and the projection's offset."""
    diff = fp.Difference(
        expected=(1.5, 20.25, 7), found=(4.0, 30.5, 11), abs_total=99.0, bound_proj=0.125, bound_total=0.0625
    )
    assert not diff.matches
    assert diff.describe() == (
        "fingerprint expected proj 1.5, total 20.25, checksum 7; found proj 4 (differs by 2.5, bound 0.125), "
        "total 30.5 (bound 0.0625), checksum 11"
    )
