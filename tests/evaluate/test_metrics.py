"""pass@k at its boundaries: against a brute-force count over every k-subset, at k = n, with none and all correct."""

from __future__ import annotations

import itertools
from fractions import Fraction

import pytest

from r1_ascend.evaluate.metrics import mean_pass_at_k, pass_at_1, pass_at_k


def brute_force(n: int, c: int, k: int) -> Fraction:
    """The share of the k-subsets of n samples (the first c correct) that hold a correct sample."""
    subsets = list(itertools.combinations(range(n), k))
    return Fraction(sum(any(i < c for i in subset) for subset in subsets), len(subsets))


@pytest.mark.parametrize("n", range(1, 7))
def test_estimator_equals_the_count_over_all_k_subsets(n: int) -> None:
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(float(brute_force(n, c, k)), abs=1e-12), (n, c, k)


@pytest.mark.parametrize(("n", "c"), [(1, 0), (1, 1), (4, 0), (4, 1), (4, 3), (4, 4), (64, 0), (64, 1), (64, 63)])
def test_at_k_equal_n_it_is_whether_any_sample_is_correct(n: int, c: int) -> None:
    assert pass_at_k(n, c, n) == (1.0 if c > 0 else 0.0)


def test_none_correct_is_zero_and_all_correct_is_one_for_every_k() -> None:
    for k in range(1, 65):
        assert pass_at_k(64, 0, k) == 0.0
        assert pass_at_k(64, 64, k) == 1.0


def test_pass_at_1_is_the_share_of_correct_samples() -> None:
    assert pass_at_k(64, 16, 1) == pytest.approx(0.25)
    # three problems with 0, 1 and 4 of 4 correct: (0 + 1/4 + 1) / 3
    assert pass_at_1(4, [0, 1, 4]) == pytest.approx(5 / 12)
    assert mean_pass_at_k(4, [0, 1, 4], 1) == pytest.approx(5 / 12)
    # pass@2 by hand: 0, 1 - C(3,2)/C(4,2) = 1/2, 1
    assert mean_pass_at_k(4, [0, 1, 4], 2) == pytest.approx((0 + 0.5 + 1) / 3)
    assert mean_pass_at_k(4, [0, 1, 4], 4) == pytest.approx(2 / 3)


def test_an_empty_set_has_no_value() -> None:
    assert pass_at_1(4, []) is None
    assert mean_pass_at_k(4, [], 2) is None


@pytest.mark.parametrize(("n", "c", "k"), [(4, 5, 1), (4, -1, 1), (4, 2, 0), (4, 2, 5)])
def test_impossible_counts_are_refused(n: int, c: int, k: int) -> None:
    with pytest.raises(ValueError, match=r"must be between|needs 1 <= k <= n"):
        pass_at_k(n, c, k)
