"""Guarded verification: worker pool, deadline, cache, counters, thread and process safety, adversarial inputs."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

import pytest

from fixtures.grader_adversarial import adversarial_cases
from fixtures.procs import pid_alive
from ictrl import rewards
from ictrl.rewards import choice_reward, format_reward, gsm8k_reward, math_reward, reward_stats
from ictrl.rewards import verify
from ictrl.rewards.verify import _explosive, _get_pool


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



_WARM = ("\\boxed{x^2+2x+1}", "(x+1)^2")  # reaches the worker: no fast path decides it


@pytest.mark.parametrize("name", sorted(adversarial_cases()))
def test_adversarial_inputs_bounded(name: str) -> None:
    # Bounded by construction, counted rather than timed: extraction and the pre-checks are linear in the text
    # (test_extraction.test_extraction_is_linear), and each math_reward call makes at most one math-verify call,
    # which the worker's CPU budget ends; no call may reach the wall-clock backstop.
    completion = adversarial_cases()[name]
    rewards.configure(timeout=1.0)
    math_reward(*_WARM)  # worker started outside the count
    rewards.reset_reward_stats()
    assert math_reward(completion, "\\frac{1}{2}") in (0.0, 1.0)
    assert gsm8k_reward(completion, "5") in (0.0, 1.0)
    assert choice_reward(completion, "A") in (0.0, 1.0)
    assert format_reward(completion) in (0.0, 1.0)
    stats = reward_stats()
    assert stats["calls"] == 1 and stats["verify_calls"] <= 1 and stats["timeouts"] <= stats["verify_calls"], name
    assert stats["stalls"] == 0 and stats["errors"] == 0


def test_timeout_kills_worker_and_counts() -> None:
    # Not caught by the pre-checks: sympy evaluates (9^9)^(9^9) exactly, so only the CPU budget stops it.
    slow = "\\boxed{(9^9)^{(9^9)}}"
    assert not _explosive(slow[7:-1], "5")
    rewards.configure(timeout=0.5)
    math_reward(*_WARM)
    rewards.reset_reward_stats()
    assert math_reward(slow, "\\frac{1}{2}") == 0.0
    stats = reward_stats()
    assert stats["timeouts"] == 1 and stats["errors"] == 0 and stats["worker_starts"] >= 1
    # the replacement worker grades correctly
    assert math_reward("\\boxed{\\sqrt{2}/2}", "\\frac{\\sqrt2}{2}") == 1.0


def test_timeouts_are_cached() -> None:
    # Timeouts are cached: the same bomb must not cost its full budget every time.
    slow = "\\boxed{(9^9)^{(9^9)}}"
    rewards.configure(timeout=0.5, cache_size=0)
    math_reward(*_WARM)
    rewards.reset_reward_stats()
    assert math_reward(slow, "5") == 0.0
    starts = reward_stats()["worker_starts"]
    assert math_reward(slow, "5") == 0.0
    stats = reward_stats()
    assert stats["timeouts"] == 1 and stats["cached_timeouts"] == 1 and stats["worker_starts"] == starts
    assert math_reward(slow, "6") == 0.0  # another gold: another pair, graded afresh
    assert reward_stats()["timeouts"] == 2


def test_budget_is_cpu_time_not_wall_time(monkeypatch: pytest.MonkeyPatch) -> None:
    # The deadline is CPU time, so a correct answer does not score 0 on a loaded machine. A worker that gets no CPU for 2 s
    # is the extreme of a loaded machine; it sleeps that long with its 1 s budget armed, and the verdict must not
    # change (a wall-clock budget would have ended it at 1 s).
    rewards.configure(timeout=1.0, cache_size=0)
    math_reward(*_WARM)
    monkeypatch.setattr(verify, "_IDLE_BEFORE_CHECK", 2.0)
    rewards.reset_reward_stats()
    assert math_reward("\\boxed{\\sqrt{2}/2}", "\\frac{\\sqrt2}{2}") == 1.0
    stats = reward_stats()
    assert stats["verify_calls"] == 1 and stats["timeouts"] == 0 and stats["stalls"] == 0
    assert stats["worker_starts"] == 0  # the same worker answered: nothing ended it


def test_wall_backstop_covers_the_wait_for_a_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    # Waiting for a spare worker counts against the deadline. (1) No worker ever frees up: the call ends at
    # the backstop. (2) The worker does not answer before the backstop (it sleeps 600 s): the same. Both count
    # stalls, and the pool recovers.
    rewards.configure(timeout=1.0, workers=1, cache_size=0)
    math_reward(*_WARM)  # started under the default backstop: a loaded machine may take seconds to start one
    pool = _get_pool()
    held = pool.idle.get()  # another caller holds the only worker
    rewards.configure(wall_timeout=1.0)
    rewards.reset_reward_stats()
    try:
        assert math_reward("\\boxed{\\sqrt{2}/2}", "\\frac{\\sqrt2}{2}") == 0.0
        assert reward_stats()["stalls"] == 1
    finally:
        pool.idle.put(held)
    monkeypatch.setattr(verify, "_IDLE_BEFORE_CHECK", 600.0)
    assert math_reward("\\boxed{\\sqrt{2}/2}", "\\frac{\\sqrt2}{2}") == 0.0
    assert reward_stats()["stalls"] == 2
    monkeypatch.setattr(verify, "_IDLE_BEFORE_CHECK", 0.0)
    rewards.configure(wall_timeout=60.0)
    assert math_reward("\\boxed{\\sqrt{2}/2}", "\\frac{\\sqrt2}{2}") == 1.0
    assert not pid_alive(held.proc.pid)  # the silent worker was replaced, not leaked


def _cpu_limit(pid: int) -> str:
    line = next(x for x in Path(f"/proc/{pid}/limits").read_text().splitlines() if x.startswith("Max cpu time"))
    return line.split()[3]  # the soft limit, seconds


@pytest.mark.skipif(not Path("/proc/self/limits").exists(), reason="reads /proc")
def test_worker_has_a_cpu_limit() -> None:
    math_reward(*_WARM)
    assert _cpu_limit(_get_pool().all[0].proc.pid) != "unlimited"


_ORPHAN_CHILD = """
import json, sys, time
from ictrl import rewards
from ictrl.rewards.verify import _get_pool
rewards.configure(timeout=600.0, cache_size=0)  # the budget must not be what ends the worker
rewards.math_reward("\\\\boxed{x^2+2x+1}", "(x+1)^2")
while _get_pool().spare is None:
    time.sleep(0.05)
pool = _get_pool()
print(json.dumps([w.proc.pid for w in pool.all] + [pool.spare.proc.pid]), flush=True)
rewards.math_reward("\\\\boxed{(9^9)^{(9^9)}}", "5")  # busy for minutes
"""


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.integration
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_workers_die_with_their_parent() -> None:
    # kill -9 of the parent while a verify worker is busy must not leave the worker running.
    child = subprocess.Popen([sys.executable, "-c", _ORPHAN_CHILD], stdout=subprocess.PIPE, text=True,
                             env=os.environ.copy())
    try:
        pids = json.loads(child.stdout.readline())  # type: ignore[union-attr]
        assert len(pids) == 2  # a busy worker and its warm spare
        busy_since = time.monotonic()
        while _cpu_seconds(pids[0]) < 0.5 and time.monotonic() - busy_since < 60:
            time.sleep(0.05)  # the worker is inside the bomb
        child.kill()
        child.wait()
        gone_by = time.monotonic() + 10.0
        while any(pid_alive(p) for p in pids) and time.monotonic() < gone_by:
            time.sleep(0.1)
        survivors = [p for p in pids if pid_alive(p)]
    finally:
        child.kill()
    for p in survivors:
        os.kill(p, signal.SIGKILL)
    assert not survivors, f"workers {survivors} outlived their parent"


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


