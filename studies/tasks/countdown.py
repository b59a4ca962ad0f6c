"""A study task whose errors are choices, not missing skills: small Countdown targets.

A problem gives ``k`` numbers (1..9; 4 by default) and a target; the answer is a chain of steps that combines
the numbers with ``+`` and ``-``, each number used exactly once, ending on the target::

    question  "Q:3,5,7,2>13=A:"
    solution  "7+5=12;12-2=10;10+3=13;"

Several chains are usually valid (which pair to combine first, which signs, in which order), so the model
branches at every step; each step is easy arithmetic (values stay within ±36). ``*`` is left out on purpose: with
it, a first version's warm-started base (3 numbers, + - *) made two thirds of its errors in the arithmetic
(products such as ``24*5``), a missing skill, and only a third by choice. The reward verifies the chain itself (every step correct, every number
used once, the last value the target): copying the target scores nothing. The imperfect demonstrations of the
warm start are mostly *choice* errors: an arithmetically correct chain over the right numbers that lands on
another value (``choice_error``), and only rarely an arithmetic slip (``digit_error``).

Splits hash the canonical problem (sorted numbers and target), so no problem is in two splits.
The interface is ``ictrl.experiments.tasks.registry``'s (as ``tinytask``'s); from a clone's root every command that
takes a task takes this one as ``studies.tasks.countdown`` (``ictrl compare --task studies.tasks.countdown``).
"""

from __future__ import annotations

import hashlib
import itertools
import random
import re
from functools import lru_cache

from ictrl.data import Problem
from ictrl.experiments.tasks.registry import task_functions

TASK_NAME = "countdown"
DEFAULT_DIFFICULTY = (4,)  # numbers per problem when a recipe does not say
# The warm start beyond the shared recipe (TinyRecipe's defaults are tinyarith's): the demonstrations err mostly by
# choice (a correct chain to another value), rarely by an arithmetic slip. Its longer chains stay at 0% dev pass@1
# for the first ~1,000 steps: more patience than tinyarith's 6 evaluations.
RECIPE = {"order_error": 0.5, "digit_error": 0.1, "train_problems": 1300, "patience": 12, "max_steps": 4000}
SPLITS = ("train", "dev", "test")
OPS = ("+", "-")  # see the module docstring for why not "*"
MAX_NUMBER = 9  # one-digit numbers: each step is arithmetic the warm start learns; the choices are hard
DEV_FRACTION = 0.15  # 4 one-digit numbers give 2,717 problems: 15% is ~420, room for 200 held out
TEST_FRACTION = 0.15
_STEP = re.compile(r"(-?\d+)([+\-*])(-?\d+)=(-?\d+)")


def split_of(key: str) -> str:
    u = int.from_bytes(hashlib.sha256(f"{TASK_NAME}:{key}".encode()).digest()[:8], "big") / 2**64
    return "test" if u < TEST_FRACTION else "dev" if u < TEST_FRACTION + DEV_FRACTION else "train"


def _apply(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b


@lru_cache(maxsize=65536)
def chains(numbers: tuple[int, ...]) -> tuple[tuple[tuple[str, ...], int], ...]:
    """Every chain over ``numbers``: (step strings, final value). A step combines two remaining values (either
    order for ``-``; the one order ``a op b`` with a >= b for ``+`` and ``*``, plus b op a: both are listed, as both
    are valid written solutions)."""
    if len(numbers) == 1:
        return (((), numbers[0]),)
    out = []
    for i, j in itertools.permutations(range(len(numbers)), 2):
        rest = tuple(n for k, n in enumerate(numbers) if k not in (i, j))
        for op in OPS:
            value = _apply(numbers[i], op, numbers[j])
            step = f"{numbers[i]}{op}{numbers[j]}={value}"
            for steps, final in chains(tuple(sorted(rest + (value,)))):
                out.append(((step, *steps), final))
    return tuple(out)


def solutions(numbers: tuple[int, ...], target: int) -> list[tuple[str, ...]]:
    return [steps for steps, value in chains(tuple(sorted(numbers))) if value == target]


def format_solution(steps: tuple[str, ...] | list[str]) -> str:
    return "".join(s + ";" for s in steps)


def problem_key(numbers: tuple[int, ...], target: int) -> str:
    return ",".join(map(str, sorted(numbers))) + f">{target}"


def make_problem(numbers: tuple[int, ...], target: int) -> Problem:
    """The record for ``numbers`` (shown in the given order) and ``target``; ``gold`` is the canonical key
    ``"2,3,5,7>13"``, which the grader needs (the answer is a chain, not a value)."""
    if not numbers or any(not 1 <= n <= MAX_NUMBER for n in numbers):
        raise ValueError(f"numbers must be 1..{MAX_NUMBER}, got {numbers!r}")
    count = len(solutions(numbers, target))
    if not count:
        raise ValueError(f"target {target} is unreachable from {numbers!r}")
    key = problem_key(numbers, target)
    return Problem(id=f"{TASK_NAME}-{key}", question=f"Q:{','.join(map(str, numbers))}>{target}=A:", gold=key,
                   meta={"numbers": list(numbers), "target": target, "difficulty": len(numbers),
                         "solutions": count, "split": split_of(key)})


@lru_cache(maxsize=8)
def problem_keys(split: str, count: int) -> tuple[tuple[tuple[int, ...], int], ...]:
    """Every (sorted numbers, target) of ``split`` with ``count`` numbers and a target in 1..99, in a fixed
    order (enumerated, so the split sizes are exact)."""
    keys = []
    for numbers in itertools.combinations_with_replacement(range(1, MAX_NUMBER + 1), count):
        for target in sorted({v for _, v in chains(numbers) if 1 <= v <= 99}):
            if split_of(problem_key(numbers, target)) == split:
                keys.append((numbers, target))
    return tuple(keys)


def generate_problems(n: int, split: str, difficulty: int | tuple[int, ...] = DEFAULT_DIFFICULTY,
                      seed: int = 0) -> list[Problem]:
    """``n`` distinct problems of ``split`` with ``difficulty`` numbers (2..4) and targets in 1..99, the numbers
    shown in a seeded random order. Deterministic for ``seed``; raises if the split holds fewer than ``n``."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    levels = (difficulty,) if isinstance(difficulty, int) else tuple(difficulty)
    if not levels or any(not isinstance(d, int) or not 2 <= d <= 4 for d in levels):
        raise ValueError(f"difficulty must be number counts in 2..4, got {difficulty!r}")
    pool = [key for d in sorted(set(levels)) for key in problem_keys(split, d)]
    if not 0 <= n <= len(pool):
        raise ValueError(f"n={n}: split {split!r} at difficulty {levels} holds {len(pool)} problems")
    rng = random.Random(f"{TASK_NAME}:{seed}:{split}:{levels}")
    problems = []
    for numbers, target in rng.sample(pool, n):
        shown = list(numbers)
        rng.shuffle(shown)
        problems.append(make_problem(tuple(shown), target))
    return problems


def gold_solution(problem: Problem) -> str:
    return format_solution(solutions(tuple(problem.meta["numbers"]), problem.meta["target"])[0])


def demonstration(problem: Problem, rng: random.Random, order_error: float = 0.0, digit_error: float = 0.0) -> str:
    """An imperfect worked chain: a uniformly drawn valid one; with probability ``order_error`` (a *choice*
    error) a correct chain over the same numbers that ends elsewhere; then with probability ``digit_error`` one
    result digit corrupted (an arithmetic slip, carried into the next step)."""
    numbers, target = tuple(problem.meta["numbers"]), problem.meta["target"]
    every = chains(tuple(sorted(numbers)))
    wrong = [s for s, v in every if v != target]
    pool = wrong if wrong and rng.random() < order_error else [s for s, v in every if v == target]
    steps = list(rng.choice(pool))
    if rng.random() < digit_error:
        at = rng.randrange(len(steps))
        lhs, value = steps[at].split("=")
        digits = list(value.lstrip("-"))
        j = rng.randrange(len(digits))
        digits[j] = str((int(digits[j]) + rng.randint(1, 9)) % 10)
        slipped = ("-" if value.startswith("-") else "") + str(int("".join(digits)))
        steps[at] = f"{lhs}={slipped}"
        if at + 1 < len(steps):  # the next step reads the slipped value, as a person would
            steps[at + 1] = re.sub(rf"(?<![\d-]){re.escape(value)}(?!\d)", slipped, steps[at + 1], count=1)
    return format_solution(steps)


def check_chain(text: str, numbers: list[int], target: int) -> bool:
    """True when ``text`` is ``step;step;...`` (at most one trailing ``;`` and whitespace) where each step
    ``a op b = c`` is correct arithmetic over two values still available, all numbers are used and the last
    value is ``target``."""
    body = text.strip()
    if body.endswith(";"):
        body = body[:-1]
    pool = list(numbers)
    if not body:
        return False
    for part in body.split(";"):
        m = _STEP.fullmatch(part.strip())
        if m is None:
            return False
        a, op, b, c = int(m[1]), m[2], int(m[3]), int(m[4])
        if op not in OPS or _apply(a, op, b) != c:
            return False
        for v in (a, b):
            if v not in pool:
                return False
            pool.remove(v)
        pool.append(c)
    return pool == [target]


def parse_gold(gold: str) -> tuple[list[int], int]:
    numbers, target = gold.split(">")
    return [int(x) for x in numbers.split(",")], int(target)


def extract_answer(completion: str) -> str | None:
    """The chain as written (its steps), for the record."""
    text = completion.strip()
    return text or None


def grade(completion: str, gold: str) -> float:
    """1.0 when the completion is a valid chain for the problem ``gold`` names (``"2,3,5,7>13"``), else 0.0."""
    numbers, target = parse_gold(gold)
    return 1.0 if check_chain(completion, numbers, target) else 0.0


def max_new_tokens(difficulty: tuple[int, ...]) -> int:
    """Room for (k - 1) steps of up to ``"-27-9=-36;"`` (10 bytes), plus EOS and slack."""
    return 12 * (max(difficulty) - 1) + 8


countdown_reward, train_dataset, eval_task = task_functions(
    TASK_NAME, generate_problems, grade, extract_answer,
    available=lambda levels: sum(len(problem_keys("train", d)) for d in set(levels)))
reward = countdown_reward
