"""pass@1 and pass@k over problems from each problem's count of correct samples.

pass@1 is the DeepSeek-R1 report's (arXiv:2501.12948, "Evaluation Setup"): the mean over problems of correct / n
with n samples per problem. pass@k is the unbiased estimator of Chen et al. 2021 (arXiv:2107.03374, "Evaluating Large
Language Models Trained on Code"), ``1 - C(n - c, k) / C(n, k)`` per problem: the chance that k of the n samples,
drawn without replacement, hold at least one correct one. At k = n it is 1 when any sample is correct, else 0; at
k = 1 it equals c / n.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of one problem with ``c`` correct samples out of ``n``."""
    if not 0 <= c <= n:
        msg = f"correct samples {c} must be between 0 and the {n} samples drawn"
        raise ValueError(msg)
    if not 1 <= k <= n:
        msg = f"pass@k needs 1 <= k <= n samples per problem, got k={k}, n={n}"
        raise ValueError(msg)
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def mean_pass_at_k(n: int, correct: Sequence[int], k: int) -> float | None:
    """Mean of :func:`pass_at_k` over problems; None for a set without problems."""
    if not correct:
        return None
    return sum(pass_at_k(n, c, k) for c in correct) / len(correct)


def pass_at_1(n: int, correct: Sequence[int]) -> float | None:
    """Mean over problems of correct / n (the R1 report's pass@1); None for a set without problems."""
    if not correct:
        return None
    return sum(c / n for c in correct) / len(correct)
