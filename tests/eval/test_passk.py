import math
import statistics
from fractions import Fraction

import numpy as np
import pytest

from ictrl.eval.passk import bootstrap_ci, mean_std, pass_at_k


def comb_reference(n: int, c: int, k: int) -> float:
    """Closed form with exact integers: 1 - C(n-c, k) / C(n, k)."""
    return float(1 - Fraction(math.comb(n - c, k), math.comb(n, k)))


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (4, 1, 4, 1.0),
        (4, 1, 1, 0.25),
        (4, 2, 2, 5 / 6),
        (4, 0, 1, 0.0),
        (4, 0, 4, 0.0),
        (4, 4, 1, 1.0),
        (4, 3, 2, 1.0),  # any 2 of 4 include one of the 3 correct
        (10, 3, 2, 1 - 21 / 45),  # C(7,2)=21, C(10,2)=45
        (1, 1, 1, 1.0),
    ],
)
def test_hand_computed_cases(n: int, c: int, k: int, expected: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-15)


def test_matches_math_comb_on_a_grid() -> None:
    checked = 0
    for n in range(1, 41):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(comb_reference(n, c, k), rel=1e-12, abs=1e-14)
                checked += 1
    assert checked > 10_000


def test_pass_at_1_is_fraction_correct() -> None:
    for n, c in [(16, 5), (1024, 77), (4096, 1)]:
        assert pass_at_k(n, c, 1) == pytest.approx(c / n, rel=1e-12)


@pytest.mark.parametrize("n", [1024, 4096])
def test_large_n_is_finite_and_exact(n: int) -> None:
    rng = np.random.default_rng(0)
    for _ in range(20):
        c = int(rng.integers(0, n + 1))
        k = int(rng.integers(1, n + 1))
        value = pass_at_k(n, c, k)
        assert math.isfinite(value) and 0.0 <= value <= 1.0
        assert value == pytest.approx(comb_reference(n, c, k), rel=1e-9, abs=1e-12)


@pytest.mark.parametrize(
    ("n", "c", "k", "word"),
    [(4, 1, 5, "k=5"), (4, 5, 1, "c=5"), (-1, 0, 1, "n must"), (4, -1, 1, "c must"), (4, 1, 0, "k must"), (4, 1.0, 1, "c must")],
)
def test_invalid_arguments_raise(n: int, c: int, k: int, word: str) -> None:
    with pytest.raises(ValueError, match=word):
        pass_at_k(n, c, k)


def test_mean_std_matches_statistics_module() -> None:
    values = [0.1, 0.35, 0.2, 0.55]
    mean, std = mean_std(values)
    assert mean == pytest.approx(statistics.fmean(values), abs=1e-15)
    assert std == pytest.approx(statistics.stdev(values), abs=1e-15)
    single_mean, single_std = mean_std([0.3])
    assert single_mean == 0.3 and math.isnan(single_std)
    with pytest.raises(ValueError, match="non-empty"):
        mean_std([])


def naive_bootstrap(groups: list[list[float]], n_boot: int, ci: float, seed: int) -> tuple[float, float]:
    """Python loops over the same draws the implementation documents (group by group, [n_boot, P] indices)."""
    rng = np.random.default_rng(seed)
    draws = [rng.integers(0, len(g), size=(n_boot, len(g))) for g in groups]
    reps = []
    for b in range(n_boot):
        means = [sum(g[i] for i in idx[b]) / len(g) for g, idx in zip(groups, draws)]
        reps.append(sum(means) / len(means))
    reps.sort()
    alpha = (1 - ci) / 2
    return float(np.quantile(reps, alpha)), float(np.quantile(reps, 1 - alpha))


def test_bootstrap_matches_naive_reference() -> None:
    rng = np.random.default_rng(1)
    groups = [rng.random(13).tolist(), rng.integers(0, 2, 7).astype(float).tolist()]
    got = bootstrap_ci(groups, n_boot=300, ci=0.9, seed=5)
    ref = naive_bootstrap(groups, n_boot=300, ci=0.9, seed=5)
    assert got == pytest.approx(ref, abs=1e-12)


def test_bootstrap_contains_mean_and_narrows_with_more_problems() -> None:
    rng = np.random.default_rng(2)
    widths = []
    for size in (40, 2000):
        scores = (rng.random(size) < 0.3).astype(float)
        low, high = bootstrap_ci(scores, n_boot=2000, seed=0)
        assert low <= scores.mean() <= high
        widths.append(high - low)
    assert widths[1] < widths[0] / 3  # width shrinks like 1/sqrt(P): sqrt(50) ~ 7
    # seeded: same seed, same interval
    scores = rng.random(30)
    assert bootstrap_ci(scores, seed=3) == bootstrap_ci(scores, seed=3)


def test_bootstrap_of_constant_scores_is_a_point() -> None:
    assert bootstrap_ci([[0.5] * 10, [1.0] * 3]) == pytest.approx((0.75, 0.75))


def test_bootstrap_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="groups\\[1\\]"):
        bootstrap_ci([[0.1, 0.2], []])
    with pytest.raises(ValueError, match="ci"):
        bootstrap_ci([0.1, 0.2], ci=1.5)
