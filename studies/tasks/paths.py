"""A study task built for uncertain forks: walks of a given length through a fixed directed graph.

The graph has ``len(NODES)`` nodes (the letters a-z) and ``DEGREE`` out-edges per node, drawn once from a fixed
seed. A problem names a start, a target and a length ``L``; the answer is the ``L`` nodes a walk visits after the
start, one letter per node, the last of them the target::

    question  "Q:g>f/5=A:"
    solution  "uozwf"

Every letter of an answer is a choice among the current node's ``DEGREE`` successors, and the median problem has
over a hundred valid walks, so a base that learned the demonstrations spreads its probability over several letters
at nearly every position. The answer has no separators and its length is fixed by the question, so the responses to
one prompt stay position-aligned: at a position where two responses sit at different nodes their next-token
distributions have different supports. That is the regime of the paper's ICT tokens (uncertain tokens where a
response departs from its group), which the other two tasks hardly reach: there the JS score's top tokens are
near-certain ones (π 0.8-0.95). An idealised base (the exact conditional of the demonstration mixture below) puts
ICT's top-10% tokens at π ≈ 0.3 on this graph (``tests/studies/tasks/test_paths.py``); the trained base is
measured, not assumed (``studies/horizon_pilot.py``).

The demonstrations of the warm start are uniformly drawn valid walks or, with probability ``order_error``, a
*choice* error: a walk along valid edges that ends on another node; then with probability ``digit_error`` one
letter replaced by another (usually an edge that does not exist). The reward checks the walk itself.

Splits hash the problem key ``"g>f/5"``, so no problem is in two splits. The interface is
``ictrl.experiments.tasks.registry``'s (as ``tinytask``'s); from a clone's root every command that takes a task takes
this one as ``studies.tasks.paths`` (``ictrl tiny-model --task studies.tasks.paths``, ``ictrl regime --prompts
studies.tasks.paths``).
"""

from __future__ import annotations

import hashlib
import random
from functools import lru_cache

from ictrl.data import Problem
from ictrl.experiments.tasks.registry import task_functions

TASK_NAME = "paths"
SPLITS = ("train", "dev", "test")
NODES = "abcdefghijklmnopqrstuvwxyz"
DEGREE = 5  # out-edges per node; simulated with an idealised base, ICT's tokens sit at π 0.52, 0.40, 0.31, 0.24
# for 3, 4, 5, 6
GRAPH_SEED = "paths:graph:0"
LENGTHS = (2, 8)  # the lengths a problem may ask for (difficulty)
DEFAULT_DIFFICULTY = (4, 5, 6)  # walk lengths when a recipe does not say
# The warm start beyond the shared recipe: countdown's kinds of error (a walk to another node; a missing edge) and
# patience, over the whole train split.
RECIPE = {"order_error": 0.5, "digit_error": 0.1, "train_problems": 1400, "patience": 12, "max_steps": 4000}
DEV_FRACTION = 0.15  # 26 x 26 pairs x 3 lengths: 15% is ~300 problems, room for 200 held out
TEST_FRACTION = 0.15


def _graph() -> dict[str, tuple[str, ...]]:
    rng = random.Random(GRAPH_SEED)
    return {u: tuple(sorted(rng.sample([v for v in NODES if v != u], DEGREE))) for u in NODES}


GRAPH: dict[str, tuple[str, ...]] = _graph()


def split_of(key: str) -> str:
    u = int.from_bytes(hashlib.sha256(f"{TASK_NAME}:{key}".encode()).digest()[:8], "big") / 2**64
    return "test" if u < TEST_FRACTION else "dev" if u < TEST_FRACTION + DEV_FRACTION else "train"


@lru_cache(maxsize=None)
def walks(start: str, target: str, length: int) -> int:
    """The number of walks of ``length`` edges from ``start`` to ``target``."""
    if length == 0:
        return int(start == target)
    return sum(walks(v, target, length - 1) for v in GRAPH[start])


def problem_key(start: str, target: str, length: int) -> str:
    return f"{start}>{target}/{length}"


def parse_gold(gold: str) -> tuple[str, str, int]:
    ends, length = gold.split("/")
    start, target = ends.split(">")
    return start, target, int(length)


def _check_length(length: int) -> None:
    if isinstance(length, bool) or not isinstance(length, int) or not LENGTHS[0] <= length <= LENGTHS[1]:
        raise ValueError(f"difficulty must be walk lengths in {LENGTHS[0]}..{LENGTHS[1]}, got {length!r}")


def make_problem(start: str, target: str, length: int) -> Problem:
    """The record for a walk of ``length`` from ``start`` to ``target``; ``gold`` is the key ``"g>f/5"``."""
    if start not in GRAPH or target not in GRAPH:
        raise ValueError(f"nodes must be letters a-z, got {start!r}, {target!r}")
    _check_length(length)
    count = walks(start, target, length)
    if not count:
        raise ValueError(f"{target!r} is unreachable from {start!r} in exactly {length} steps")
    key = problem_key(start, target, length)
    return Problem(id=f"{TASK_NAME}-{key}", question=f"Q:{key}=A:", gold=key,
                   meta={"start": start, "target": target, "difficulty": length, "solutions": count,
                         "split": split_of(key)})


@lru_cache(maxsize=16)
def problem_keys(split: str, length: int) -> tuple[tuple[str, str], ...]:
    """Every reachable (start, target) of ``split`` at ``length``, in a fixed order."""
    return tuple((s, t) for s in NODES for t in NODES
                 if walks(s, t, length) and split_of(problem_key(s, t, length)) == split)


def generate_problems(n: int, split: str, difficulty: int | tuple[int, ...] = DEFAULT_DIFFICULTY,
                      seed: int = 0) -> list[Problem]:
    """``n`` distinct problems of ``split`` with walk lengths ``difficulty``. Deterministic for ``seed``; raises if
    the split holds fewer than ``n``."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    levels = (difficulty,) if isinstance(difficulty, int) else tuple(difficulty)
    if not levels:
        raise ValueError(f"difficulty must be walk lengths in {LENGTHS[0]}..{LENGTHS[1]}, got {difficulty!r}")
    for d in levels:
        _check_length(d)
    pool = [(s, t, d) for d in sorted(set(levels)) for s, t in problem_keys(split, d)]
    if not 0 <= n <= len(pool):
        raise ValueError(f"n={n}: split {split!r} at difficulty {levels} holds {len(pool)} problems")
    rng = random.Random(f"{TASK_NAME}:{seed}:{split}:{levels}")
    return [make_problem(*key) for key in rng.sample(pool, n)]


def random_walk(start: str, length: int, rng: random.Random, target: str) -> str:
    """A walk of ``length`` edges from ``start`` to ``target``, as its letters after ``start``, uniform over all
    such walks (each step weighted by the walks it leaves)."""
    out, node = [], start
    for left in range(length, 0, -1):
        options = GRAPH[node]
        node = rng.choices(options, weights=[walks(v, target, left - 1) for v in options])[0]
        out.append(node)
    return "".join(out)


def gold_solution(problem: Problem) -> str:
    return random_walk(problem.meta["start"], problem.meta["difficulty"], random.Random(problem.gold),
                       problem.meta["target"])


def demonstration(problem: Problem, rng: random.Random, order_error: float = 0.0, digit_error: float = 0.0) -> str:
    """An imperfect walk: a uniformly drawn valid one; with probability ``order_error`` (a *choice* error) a walk
    along valid edges that ends elsewhere; then with probability ``digit_error`` one letter replaced (a slip)."""
    start, target, length = problem.meta["start"], problem.meta["target"], problem.meta["difficulty"]
    if rng.random() < order_error:
        ends = [t for t in NODES if t != target and walks(start, t, length)]
        walk = random_walk(start, length, rng, rng.choices(ends, weights=[walks(start, t, length) for t in ends])[0])
    else:
        walk = random_walk(start, length, rng, target)
    if rng.random() < digit_error:
        at = rng.randrange(length)
        walk = walk[:at] + rng.choice([v for v in NODES if v != walk[at]]) + walk[at + 1:]
    return walk


def check_walk(text: str, start: str, target: str, length: int) -> bool:
    """True when ``text`` (surrounding whitespace aside) is ``length`` letters, each a successor of the one before
    (the first of ``start``), the last ``target``."""
    walk = text.strip()
    if len(walk) != length or walk[-1:] != target:
        return False
    node = start
    for v in walk:
        if v not in GRAPH.get(node, ()):
            return False
        node = v
    return True


def extract_answer(completion: str) -> str | None:
    """The walk as written, for the record."""
    text = completion.strip()
    return text or None


def grade(completion: str, gold: str) -> float:
    """1.0 when the completion is a valid walk for the problem ``gold`` names (``"g>f/5"``), else 0.0."""
    return 1.0 if check_walk(completion, *parse_gold(gold)) else 0.0


def max_new_tokens(difficulty: tuple[int, ...]) -> int:
    """The longest walk's letters, EOS and slack."""
    return max(difficulty) + 4


paths_reward, train_dataset, eval_task = task_functions(
    TASK_NAME, generate_problems, grade, extract_answer,
    available=lambda levels: sum(len(problem_keys("train", d)) for d in set(levels)))
reward = paths_reward
