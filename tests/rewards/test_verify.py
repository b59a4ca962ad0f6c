"""Guarded verification: worker pool, deadline, cache, counters, thread and process safety, adversarial inputs."""

from __future__ import annotations

import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

import pytest

from fixtures.grader_adversarial import adversarial_cases
from ictrl import rewards
from ictrl.rewards import choice_reward, format_reward, gsm8k_reward, math_reward, reward_stats
from ictrl.rewards.verify import _explosive


def test_math_reward_guards_agree_and_count() -> None:
    pairs = [("\\boxed{\\frac{1}{2}}", "0.5"), ("\\boxed{\\sqrt{2}/2}", "\\frac{\\sqrt2}{2}"), ("\\boxed{3}", "\\pi")]
    rewards.configure(cache_size=0)
    rewards.reset_reward_stats()
    via_process = [math_reward(c, g) for c, g in pairs]
    stats = reward_stats()
    assert stats["calls"] == 3 and stats["verify_calls"] == 3 and stats["timeouts"] == 0
    rewards.configure(guard="inline", cache_size=0)
    assert [math_reward(c, g) for c, g in pairs] == via_process == [1.0, 1.0, 0.0]


def test_math_reward_cache_hits() -> None:
    rewards.reset_reward_stats()
    for _ in range(3):
        assert math_reward("\\boxed{\\frac{2}{4}}", "0.5") == 1.0
    assert reward_stats()["cache_hits"] == 2



@pytest.mark.parametrize("name", sorted(adversarial_cases()))
def test_adversarial_inputs_bounded(name: str) -> None:
    completion = adversarial_cases()[name]
    math_reward("\\boxed{1}", "\\frac{1}{2}")  # worker started outside the timing
    t0 = time.perf_counter()
    result = math_reward(completion, "\\frac{1}{2}")
    elapsed = time.perf_counter() - t0
    assert result in (0.0, 1.0)
    assert elapsed < 5.0, f"{name}: {elapsed:.2f}s"
    assert gsm8k_reward(completion, "5") in (0.0, 1.0)
    assert choice_reward(completion, "A") in (0.0, 1.0)
    assert format_reward(completion) in (0.0, 1.0)


def test_timeout_kills_worker_and_counts() -> None:
    # Not caught by the pre-checks: sympy evaluates (9^9)^(9^9) exactly, so only the deadline stops it.
    slow = "\\boxed{(9^9)^{(9^9)}}"
    assert not _explosive(slow[7:-1], "5")
    rewards.configure(timeout=1.0)
    math_reward("\\boxed{1}", "\\frac{1}{2}")
    rewards.reset_reward_stats()
    t0 = time.perf_counter()
    assert math_reward(slow, "\\frac{1}{2}") == 0.0
    assert time.perf_counter() - t0 < 3.0
    stats = reward_stats()
    assert stats["timeouts"] == 1 and stats["worker_starts"] >= 1
    # the replacement worker grades correctly
    assert math_reward("\\boxed{\\frac{2}{4}}", "\\frac{1}{2}") == 1.0


_PAIRS = [
    (f"so \\boxed{{{a}}}", g)
    for a, g in [
        ("\\frac{1}{2}", "0.5"), ("2", "3"), ("\\sqrt{8}", "2\\sqrt{2}"), ("x^2", "x\\cdot x"), ("(1,2)", "(2,1)"),
        ("\\pi", "3.14159"), ("10\\%", "0.1"), ("-4", "-4.0"), ("\\infty", "\\infty"), ("\\{1,2\\}", "\\{2,1\\}"),
    ]
]


def _grade_all(pairs: list[tuple[str, str]]) -> list[float]:
    return [math_reward(c, g) for c, g in pairs]


def test_thread_safety() -> None:
    rewards.configure(cache_size=0, workers=2)
    sequential = _grade_all(_PAIRS)
    assert sum(sequential) >= 5  # the list mixes right and wrong answers
    with ThreadPoolExecutor(max_workers=4) as pool:
        threaded = list(pool.map(lambda p: math_reward(*p), _PAIRS * 3))
    assert threaded == sequential * 3


@pytest.mark.integration
def test_forked_process_pool() -> None:
    rewards.configure(cache_size=0)
    sequential = _grade_all(_PAIRS)  # the parent's worker exists before the fork: children must not share it
    with ProcessPoolExecutor(max_workers=2, mp_context=multiprocessing.get_context("fork")) as pool:
        forked = list(pool.map(_grade_all, [_PAIRS, _PAIRS]))
    assert forked == [sequential, sequential]


@pytest.mark.integration
def test_daemonic_spawned_pool() -> None:
    # multiprocessing.Pool workers are daemonic (they may not start multiprocessing children) and "spawn"
    # re-imports everything: the plain-subprocess verify worker must still work there.
    rewards.configure(cache_size=0)
    sequential = _grade_all(_PAIRS)
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        spawned = pool.map(_grade_all, [_PAIRS, _PAIRS])
    assert spawned == [sequential, sequential]


