"""Welch's interval and test against published values and a naive float64 recomputation."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from ictrl.experiments.reports.stats_tests import sample_std, welch_diff


def test_welch_matches_r_t_test() -> None:
    # R: t.test(c(1, 2, 3), c(4, 5, 6)) -> t = -3.6742, df = 4, p-value = 0.02131,
    # 95 percent confidence interval: -5.266958 -0.733042
    d = welch_diff([1.0, 2.0, 3.0], [4.0, 5.0, 6.0])
    assert d.mean == -3.0
    assert d.df == pytest.approx(4.0, rel=1e-12)
    assert d.lo == pytest.approx(-5.266958, abs=1e-6) and d.hi == pytest.approx(-0.733042, abs=1e-6)
    assert d.p == pytest.approx(0.02131, abs=5e-6)
    assert d.excludes_zero


def test_welch_unequal_variances_against_naive_float64() -> None:
    a = [61.2, 60.5, 62.4, 59.8]
    b = [54.1, 55.0, 53.6]
    d = welch_diff(a, b, confidence=0.9)
    x, y = np.array(a, dtype=np.float64), np.array(b, dtype=np.float64)
    va, vb = x.var(ddof=1) / len(x), y.var(ddof=1) / len(y)
    df = (va + vb) ** 2 / (va**2 / (len(x) - 1) + vb**2 / (len(y) - 1))
    assert d.df == pytest.approx(df, rel=1e-12)
    # published one-sided 95% quantiles bracket the interval: t(0.95, 4) = 2.131847, t(0.95, 5) = 2.015048
    half = (d.hi - d.lo) / 2 / math.sqrt(va + vb)
    assert 4 < df < 5 and 2.015048 < half < 2.131847
    from scipy import stats

    assert d.p == pytest.approx(stats.ttest_ind(a, b, equal_var=False).pvalue, rel=1e-10)


def test_small_and_degenerate_samples() -> None:
    one = welch_diff([0.5], [0.4, 0.3])
    assert one.lo is None and one.p is None and str(one) == "+0.15 (CI n/a)" and not one.excludes_zero
    same = welch_diff([1.0, 1.0], [0.5, 0.5])
    assert (same.lo, same.hi, same.p) == (0.5, 0.5, 0.0)
    assert welch_diff([1.0, 1.0], [1.0, 1.0]).p == 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one constant side is exact, not a precision warning
        half = welch_diff([1.0, 1.0], [0.5, 0.3])
    assert half.df == pytest.approx(1.0) and half.hi == pytest.approx(0.6 + 12.706205 * 0.1, abs=1e-6)
    with pytest.raises(ValueError, match="confidence"):
        welch_diff([1.0, 2.0], [1.0, 2.0], confidence=1.0)
    assert sample_std([2.0]) is None and sample_std([1.0, 3.0]) == pytest.approx(math.sqrt(2.0))
