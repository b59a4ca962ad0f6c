"""A small sample of the grader corpus (bench/bench_grader.py grades all 10k+ cases, at idle and under a
CPU hog): no crash, no stall, every certain verdict right, and a repeated bomb costs its budget once."""

from __future__ import annotations

import random

from fixtures.grader_adversarial import grade, grader_corpus
from ictrl import rewards
from ictrl.rewards import reward_stats


def test_grader_corpus_sample(shared_data) -> None:
    from ictrl.data import load_problems

    golds = [p.gold for p in load_problems("math500", data_root=shared_data)]
    golds = random.Random(0).sample(golds, 25)
    cases = grader_corpus(golds, seed=1, junk=150, choices=40, bombs=1, bomb_repeats=2)
    assert len(cases) > 400
    rewards.configure(timeout=1.0, cache_size=0)
    rewards.reset_reward_stats()
    verdicts = [grade(c) for c in cases]  # any exception fails the test
    assert set(verdicts) <= {0.0, 1.0}
    wrong = [(c.family, c.gold, c.completion[:80]) for c, v in zip(cases, verdicts)
             if c.expected is not None and v != c.expected]
    assert not wrong, wrong[:10]
    assert sum(c.expected is not None for c in cases) > 0.8 * len(cases)
    stats = reward_stats()
    assert stats["stalls"] == 0 and stats["errors"] == 0
    # bombs that reach the worker: adversarial/tower_past_prechecks once, one random tower twice (cached the 2nd time)
    assert stats["timeouts"] <= 2 and stats["cached_timeouts"] >= 1
