"""A synthetic verifiable task small enough for RL on a 2-core CPU: operator precedence.

A problem is an expression of one-digit operands joined by ``+`` and ``*``::

    question  "Q:3+4*5=A:"
    solution  "4*5=20;3+20=23;\\boxed{23}"

The solution applies one operator per step (all ``*`` first, left to right, then
``+``), so the first choice a model makes (which operator to apply) decides the
answer. The imperfect demonstrations used for the warm start evaluate left to right
part of the time, a choice error that binary-reward RL can correct, unlike the
missing-skill errors (carries) a first probe of the task produced.

Splits are assigned by hashing the canonical expression, so train, dev and test
never share a problem whatever the seed or difficulty.
"""

from __future__ import annotations

import hashlib
import random
import re

from ictrl.data import Problem
from ictrl.experiments.tasks.registry import task_functions
from ictrl.rewards import MathExtractor, math_reward

SPLITS = ("train", "dev", "test")
OPS = ("+", "*")
TASK_NAME = "tinyarith"
DEFAULT_DIFFICULTY = (2,)  # operators per problem when a recipe does not say (TinyRecipe's default)
# Fractions of the hash space; the rest is train.
DEV_FRACTION = 0.1
TEST_FRACTION = 0.1
TASK_EXTRACTOR = MathExtractor(order=("boxed",))


def split_of(expression: str) -> str:
    """The split a canonical expression belongs to, from a stable hash (not Python's salted ``hash``)."""
    digest = hashlib.sha256(f"{TASK_NAME}:{expression}".encode()).digest()
    u = int.from_bytes(digest[:8], "big") / 2**64
    if u < TEST_FRACTION:
        return "test"
    if u < TEST_FRACTION + DEV_FRACTION:
        return "dev"
    return "train"


def _apply(a: int, op: str, b: int) -> int:
    return a * b if op == "*" else a + b


def solve_steps(operands: list[int], ops: list[str], precedence: bool = True) -> tuple[list[str], int]:
    """Step strings ``"a*b=c"`` and the value, applying ``*`` before ``+`` (or strictly left to right). ``operands``
    and ``ops`` alternate as :func:`make_problem`'s checked expression has them (one more operand than ops)."""
    vals, ops = list(operands), list(ops)
    steps = []
    while ops:
        i = ops.index("*") if precedence and "*" in ops else 0
        out = _apply(vals[i], ops[i], vals[i + 1])
        steps.append(f"{vals[i]}{ops[i]}{vals[i + 1]}={out}")
        vals[i : i + 2] = [out]
        del ops[i]
    return steps, vals[0]


def format_solution(steps: list[str], answer: int | str) -> str:
    return "".join(s + ";" for s in steps) + f"\\boxed{{{answer}}}"


def _parse_expression(expression: str) -> tuple[list[int], list[str]]:
    tokens = re.findall(r"\d|[+*]", expression)
    return [int(t) for t in tokens[0::2]], tokens[1::2]


def make_problem(expression: str) -> Problem:
    """The problem record for a canonical expression such as ``"3+4*5"``."""
    if not re.fullmatch(r"[1-9]([+*][1-9])+", expression):
        raise ValueError(f"expression {expression!r} must be one-digit operands 1-9 joined by + or *")
    operands, ops = _parse_expression(expression)
    _, value = solve_steps(operands, ops)
    order_matters = solve_steps(operands, ops, precedence=False)[1] != value
    return Problem(
        id=f"{TASK_NAME}-{expression}",
        question=f"Q:{expression}=A:",
        gold=str(value),
        meta={"expression": expression, "difficulty": len(ops), "split": split_of(expression),
              "order_matters": order_matters},
    )


def generate_problems(n: int, split: str, difficulty: int | tuple[int, ...] = (2, 3), seed: int = 0) -> list[Problem]:
    """``n`` distinct problems of ``split`` with ``difficulty`` operators (one value or a tuple to mix).

    Deterministic for ``seed``; raises if the split holds fewer than ``n`` problems.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    levels = (difficulty,) if isinstance(difficulty, int) else tuple(difficulty)
    if not levels or any(not isinstance(d, int) or d < 1 or d > 6 for d in levels):
        raise ValueError(f"difficulty must be operator counts in 1..6, got {difficulty!r}")
    capacity = sum(9 ** (d + 1) * 2**d for d in levels)
    share = {"test": TEST_FRACTION, "dev": DEV_FRACTION}.get(split, 1.0 - TEST_FRACTION - DEV_FRACTION)
    # 90% of the expected split size: well inside the hash split's spread, so rejection sampling ends quickly.
    if n < 0 or n > 0.9 * share * capacity:
        raise ValueError(f"n={n} is negative or too many for split {split!r} at difficulty {levels}")
    rng = random.Random(f"{TASK_NAME}:{seed}:{split}:{levels}")
    seen: set[str] = set()
    problems = []
    while len(problems) < n:
        d = rng.choice(levels)
        operands = [rng.randint(1, 9) for _ in range(d + 1)]
        ops = [rng.choice(OPS) for _ in range(d)]
        expression = "".join(f"{a}{o}" for a, o in zip(operands, ops)) + str(operands[-1])
        if expression in seen or split_of(expression) != split:
            continue
        seen.add(expression)
        problems.append(make_problem(expression))
    return problems


def demonstration(problem: Problem, rng: random.Random, order_error: float = 0.0, digit_error: float = 0.0) -> str:
    """An imperfect worked solution: left-to-right order with probability ``order_error``, then one digit
    of an intermediate result corrupted with probability ``digit_error`` (errors propagate to the answer)."""
    operands, ops = _parse_expression(problem.meta["expression"])
    precedence = rng.random() >= order_error
    if rng.random() >= digit_error:
        steps, value = solve_steps(operands, ops, precedence)
        return format_solution(steps, value)
    # Recompute with the corrupted intermediate so the chain stays self-consistent after the slip.
    vals, ops_left, steps = list(operands), list(ops), []
    slip_at = rng.randrange(len(ops))
    while ops_left:
        i = ops_left.index("*") if precedence and "*" in ops_left else 0
        out = _apply(vals[i], ops_left[i], vals[i + 1])
        if len(steps) == slip_at:
            digits = list(str(out))
            j = rng.randrange(len(digits))
            digits[j] = str((int(digits[j]) + rng.randint(1, 9)) % 10)
            out = int("".join(digits)) or 1
        steps.append(f"{vals[i]}{ops_left[i]}{vals[i + 1]}={out}")
        vals[i : i + 2] = [out]
        del ops_left[i]
    return format_solution(steps, vals[0])


def extract_answer(completion: str) -> str | None:
    """The answer in the last ``\\boxed{...}``, or None (no fallback to the last number)."""
    return TASK_EXTRACTOR.extract(completion)


def grade(completion: str, gold: str) -> float:
    """``ictrl.rewards.math_reward`` with a boxed-only extractor (1.0 or 0.0).

    math_reward's default falls back to the last number in the text, which here would credit an unfinished
    chain that stops on the right intermediate value; the task's format asks for a boxed answer.
    math_reward's integer fast path makes this ~10 µs a call, cheap enough for every RL rollout.
    """
    return math_reward(completion, gold, extractor=TASK_EXTRACTOR)


def max_new_tokens(difficulty: tuple[int, ...]) -> int:
    """Room for the longest left-to-right chain (products up to 4 digits) plus the answer and EOS."""
    return 14 * max(difficulty) + 16


# RL prompts: at most 2,000, most of the split at difficulty 2.
tinyarith_reward, train_dataset, eval_task = task_functions(TASK_NAME, generate_problems, grade, extract_answer,
                                                            available=lambda levels: 2000)
reward = tinyarith_reward  # the name the registry (ictrl.experiments.tasks.registry) looks up
