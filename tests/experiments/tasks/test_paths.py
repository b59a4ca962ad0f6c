"""The paths embedded task: the walk grader, counts against brute force, splits, the demonstrations' error kinds,
uniform valid walks, the TRL reward, and the regime it was built for (ICT's tokens at low π)."""

from __future__ import annotations

import collections
import itertools
import math
import random

import pytest
import torch

from ictrl.core.selection import SelectionInputs, select
from ictrl.core.stats import token_stats
from ictrl.experiments.tasks import paths
from ictrl.experiments.tasks.registry import DEFAULT_DIFFICULTY, get_task


def brute_walks(start: str, target: str, length: int) -> list[str]:
    return ["".join(w) for w in itertools.product(paths.NODES, repeat=length)
            if paths.check_walk("".join(w), start, target, length)]


def test_graph_is_fixed_and_has_the_stated_degree() -> None:
    assert len(paths.GRAPH) == len(paths.NODES) == 26
    assert all(len(set(vs)) == paths.DEGREE and u not in vs for u, vs in paths.GRAPH.items())
    assert paths._graph() == paths.GRAPH  # drawn from a fixed seed, not the process's RNG


def test_grader_checks_every_edge_the_length_and_the_end() -> None:
    start, target, length = "a", paths.GRAPH[paths.GRAPH["a"][0]][0], 2
    walk = paths.GRAPH["a"][0] + target
    gold = paths.problem_key(start, target, length)
    assert paths.grade(walk, gold) == 1.0
    assert paths.grade(f" {walk}\n", gold) == 1.0
    assert paths.grade(walk + target, gold) == 0.0  # too long
    assert paths.grade(target, gold) == 0.0  # copying the target scores nothing
    missing = next(v for v in paths.NODES if v not in paths.GRAPH["a"])
    assert paths.grade(missing + target, gold) == 0.0  # an edge that does not exist
    assert paths.grade("", gold) == 0.0
    assert get_task("paths").reward([""] * 2, [walk, "zz"], gold=[gold] * 2) == [1.0, 0.0]
    assert DEFAULT_DIFFICULTY["paths"] == (4, 5, 6)
    assert paths.grade("uozwf", "g>f/5") == 1.0  # the module docstring's example


@pytest.mark.parametrize("length", [2, 3])
def test_walk_counts_match_brute_force(length: int) -> None:
    for start, target in [("a", "b"), ("q", "q"), ("z", "k"), ("j", "m")]:
        assert paths.walks(start, target, length) == len(brute_walks(start, target, length))


def test_problems_are_reachable_split_disjoint_and_seeded() -> None:
    test = paths.generate_problems(200, "test", seed=0)
    dev = paths.generate_problems(200, "dev", seed=0)
    assert {p.gold for p in test}.isdisjoint({p.gold for p in dev})
    assert len({p.gold for p in test}) == 200
    assert [p.id for p in test] == [p.id for p in paths.generate_problems(200, "test", seed=0)]
    assert all(paths.split_of(p.gold) == "test" and p.meta["solutions"] >= 1 for p in test)
    assert all(paths.grade(paths.gold_solution(p), p.gold) == 1.0 for p in test)
    assert sum(p.meta["solutions"] > 1 for p in test) > 190  # nearly every problem has several valid walks
    with pytest.raises(ValueError, match="holds"):
        paths.generate_problems(10_000, "test")
    with pytest.raises(ValueError, match="walk lengths"):
        paths.generate_problems(1, "test", difficulty=(9,))
    s, t = next((s, t) for s in paths.NODES for t in paths.NODES if not paths.walks(s, t, 2))
    with pytest.raises(ValueError, match="unreachable"):
        paths.make_problem(s, t, 2)


def test_valid_walks_are_drawn_uniformly() -> None:
    start, target, length = "a", "b", 3
    valid = brute_walks(start, target, length)
    rng = random.Random(0)
    n = 400 * len(valid)
    counts = collections.Counter(paths.random_walk(start, length, rng, target) for _ in range(n))
    assert set(counts) == set(valid)
    # Each walk's share within 5 standard errors of uniform: a weighting bug moves shares by far more.
    p = 1 / len(valid)
    assert all(abs(c / n - p) < 5 * math.sqrt(p * (1 - p) / n) for c in counts.values())


def test_demonstrations_err_by_choice_along_valid_edges() -> None:
    problems = paths.generate_problems(200, "train", seed=1)
    rng = random.Random(0)
    for p in problems:
        start, target, length = p.meta["start"], p.meta["target"], p.meta["difficulty"]
        wrong = paths.demonstration(p, rng, order_error=1.0, digit_error=0.0)
        assert paths.grade(wrong, p.gold) == 0.0  # ends elsewhere ...
        assert paths.check_walk(wrong, start, wrong[-1], length)  # ... along edges that exist
        assert paths.grade(paths.demonstration(p, rng, 0.0, 0.0), p.gold) == 1.0
        seed = rng.random()  # the same draw twice: the slip is the only difference
        clean = paths.demonstration(p, random.Random(seed), 0.0, 0.0)
        slipped = paths.demonstration(p, random.Random(seed), 0.0, digit_error=1.0)
        assert len(slipped) == length and sum(a != b for a, b in zip(clean, slipped)) == 1


def ideal_next(start: str, target: str, length: int, prefix: str, error: float) -> dict[str, float]:
    """The exact next-letter distribution of the demonstration mixture (valid walks with weight 1 - error, walks
    that end elsewhere with weight ``error``, each uniform) after ``prefix``."""
    node = prefix[-1] if prefix else start
    left = length - len(prefix) - 1
    valid, every = paths.walks(start, target, length), paths.DEGREE ** length
    weight = {v: (1 - error) * paths.walks(v, target, left) / valid
              + error * (paths.DEGREE ** left - paths.walks(v, target, left)) / (every - valid)
              for v in paths.GRAPH[node]}
    total = sum(weight.values())
    return {v: w / total for v, w in weight.items()}


def test_an_ideal_base_puts_icts_tokens_at_low_probability() -> None:
    """The design claim of the task: where the responses of a group are position-aligned and the base is
    uncertain at every letter, ICT's top-10% tokens (JS against the group mean) are uncertain ones, π < 0.5, and
    less probable than the average token, the paper's regime. The other tasks' bases put them at 0.8-0.95."""
    rng = random.Random(0)
    vocab = paths.NODES + "$"  # "$": EOS
    G, problems = 8, paths.generate_problems(40, "train", seed=3)
    T = max(p.meta["difficulty"] for p in problems) + 1
    logits = torch.full((G * len(problems), T, len(vocab)), -math.inf, dtype=torch.float64)
    tokens = torch.zeros(G * len(problems), T, dtype=torch.long)
    mask = torch.zeros(G * len(problems), T, dtype=torch.bool)
    for i, p in enumerate(problems):
        start, target, length = p.meta["start"], p.meta["target"], p.meta["difficulty"]
        for g in range(G):
            row, walk = i * G + g, ""
            for t in range(length):
                dist = ideal_next(start, target, length, walk, error=0.5)
                for v, q in dist.items():
                    logits[row, t, vocab.index(v)] = math.log(q)
                walk += rng.choices(list(dist), weights=list(dist.values()))[0]
                tokens[row, t] = vocab.index(walk[-1])
            logits[row, length, vocab.index("$")] = 0.0
            tokens[row, length] = vocab.index("$")
            mask[row, : length + 1] = True
    group_ids = torch.arange(len(problems)).repeat_interleave(G)
    st = token_stats(logits, mask, tokens, group_ids=group_ids)
    chosen = select("ict", SelectionInputs(mask=mask, ict_score=st.ict_score, group_ids=group_ids))
    assert chosen.sum().item() == G * len(problems)  # ceil(10% of <= 7 tokens): one token per response
    pi_selected, pi_all = st.prob[chosen].mean().item(), st.prob[mask].mean().item()
    assert pi_selected < 0.45 and pi_selected < pi_all - 0.05, (pi_selected, pi_all)
