"""pass@k and the aggregates reported beside it (mean ± std over seeds, bootstrap CI over problems).

All functions take and return plain floats / numpy arrays in float64; scores are fractions in [0, 1].
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples of which ``c`` are correct: 1 − C(n−c, k) / C(n, k).

    Computed as 1 − prod_{j=n−c+1..n} (1 − k/j), which never forms a binomial
    coefficient, so it stays finite and accurate for any n (Chen et al., 2021).
    """
    for name, value in (("n", n), ("c", c), ("k", k)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise ValueError(f"{name} must be an integer, got {value!r}")
        if value < 0:
            raise ValueError(f"{name} must be non-negative, got {value}")
    if k == 0:
        raise ValueError("k must be at least 1")
    if k > n:
        raise ValueError(f"k={k} exceeds the number of samples n={n}")
    if c > n:
        raise ValueError(f"c={c} correct samples exceeds the number of samples n={n}")
    if n - c < k:
        # every size-k subset contains a correct sample
        return 1.0
    prod = 1.0
    for j in range(n - c + 1, n + 1):
        prod *= 1.0 - k / j
    return 1.0 - prod


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof=1) over seeds/runs; std is NaN for a single value."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"values must be a non-empty 1-D sequence, got shape {arr.shape}")
    std = float(arr.std(ddof=1)) if arr.size > 1 else math.nan
    return float(arr.mean()), std


def bootstrap_ci(
    groups: Sequence[Sequence[float]] | Sequence[float],
    n_boot: int = 1000,
    ci: float = 0.95,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap CI of the mean of group means, resampling problems within each group.

    ``groups`` is one 1-D array of per-problem scores per benchmark ([P_g] each), or a
    single flat array (one group). Each replicate draws P_g problems with replacement
    from every group independently (a stratified bootstrap), so the overall average of
    benchmark averages gets the interval the benchmarks' own sizes justify.
    Draws are made group by group, each as an [n_boot, P_g] index matrix, from one
    ``numpy.random.default_rng(seed)``.
    """
    if n_boot < 1:
        raise ValueError(f"n_boot must be at least 1, got {n_boot}")
    if not 0.0 < ci < 1.0:
        raise ValueError(f"ci must be in (0, 1), got {ci}")
    if len(groups) == 0:
        raise ValueError("groups must not be empty")
    if np.isscalar(groups[0]):
        groups = [groups]  # type: ignore[list-item]
    arrays = [np.asarray(g, dtype=np.float64) for g in groups]
    for i, arr in enumerate(arrays):
        if arr.ndim != 1 or arr.size == 0:
            raise ValueError(f"groups[{i}] must be a non-empty 1-D array of per-problem scores, got shape {arr.shape}")
    rng = np.random.default_rng(seed)
    replicate = np.zeros(n_boot, dtype=np.float64)
    for arr in arrays:
        idx = rng.integers(0, arr.size, size=(n_boot, arr.size))
        replicate += arr[idx].mean(axis=1)
    replicate /= len(arrays)
    alpha = (1.0 - ci) / 2.0
    low, high = np.quantile(replicate, [alpha, 1.0 - alpha])
    return float(low), float(high)
