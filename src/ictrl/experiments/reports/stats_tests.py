"""Significance tests for the compare reports, from scipy (no hand-written special functions).

The studies afford 3-5 seeds per method, so the difference of two methods' means gets a Welch t-interval: exact
for normal seed noise and honest about small n, where a percentile bootstrap over seeds under-covers badly. Seeds
of two methods are treated as independent samples (not paired), which is conservative when they share data order.
"""

from __future__ import annotations

import math
import statistics
import warnings
from collections.abc import Sequence
from dataclasses import dataclass


def sample_std(values: Sequence[float]) -> float | None:
    """Sample standard deviation (ddof=1); None for fewer than two values."""
    return statistics.stdev(values) if len(values) >= 2 else None


@dataclass(frozen=True)
class DiffCI:
    """Difference of means (treatment - baseline) with a Welch t confidence interval and two-sided p-value.

    lo / hi / df / p are None when either side has fewer than two seeds (no variance estimate).
    """

    mean: float
    lo: float | None
    hi: float | None
    df: float | None
    confidence: float
    p: float | None = None

    def __str__(self) -> str:
        if self.lo is None or self.hi is None:
            return f"{self.mean:+.2f} (CI n/a)"
        return f"{self.mean:+.2f} [{self.lo:+.2f}, {self.hi:+.2f}]"

    @property
    def excludes_zero(self) -> bool:
        """True when the interval lies entirely on one side of 0 (a difference at this confidence)."""
        return self.lo is not None and self.hi is not None and (self.lo > 0 or self.hi < 0)


def welch_diff(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> DiffCI:
    """mean(a) - mean(b) with scipy's Welch t-test (``ttest_ind(a, b, equal_var=False)``): its two-sided interval
    (Welch–Satterthwaite df) and p-value. Two constant samples give a zero-width interval (p = 0 if the means
    differ, 1 if not), where scipy's t is undefined."""
    from scipy import stats

    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    if not a or not b:
        raise ValueError("welch_diff needs at least one value on each side")
    diff = math.fsum(a) / len(a) - math.fsum(b) / len(b)
    if len(a) < 2 or len(b) < 2:
        return DiffCI(diff, None, None, None, confidence)
    if statistics.variance(a) == 0.0 and statistics.variance(b) == 0.0:
        return DiffCI(diff, diff, diff, math.inf, confidence, 0.0 if diff else 1.0)
    with warnings.catch_warnings():  # one constant side: scipy warns of precision loss in its exact zero variance
        warnings.filterwarnings("ignore", "Precision loss occurred", RuntimeWarning)
        test = stats.ttest_ind(a, b, equal_var=False)
    ci = test.confidence_interval(confidence)
    return DiffCI(diff, float(ci.low), float(ci.high), float(test.df), confidence, float(test.pvalue))
