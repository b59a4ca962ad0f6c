"""The synthetic task: determinism, split disjointness, grading (against Python's own evaluator and math_reward)."""

from __future__ import annotations

import itertools
import random

import pytest

from ictrl.experiments.tasks import tinytask
from ictrl.rewards import math_reward


def gold_solution(problem: tinytask.Problem) -> str:
    """The worked solution in the operators' precedence order."""
    operands, ops = tinytask._parse_expression(problem.meta["expression"])
    return tinytask.format_solution(*tinytask.solve_steps(operands, ops))


def _all_expressions(difficulty: int) -> list[str]:
    out = []
    for operands in itertools.product("123456789", repeat=difficulty + 1):
        for ops in itertools.product("+*", repeat=difficulty):
            out.append("".join(a + o for a, o in zip(operands, ops)) + operands[-1])
    return out


def test_generation_is_deterministic_for_a_seed() -> None:
    a = tinytask.generate_problems(50, "train", (2, 3), seed=7)
    b = tinytask.generate_problems(50, "train", (2, 3), seed=7)
    c = tinytask.generate_problems(50, "train", (2, 3), seed=8)
    assert [p.question for p in a] == [p.question for p in b]
    assert [p.question for p in a] != [p.question for p in c]
    assert len({p.id for p in a}) == 50


def test_splits_partition_the_problem_space_and_never_overlap() -> None:
    expressions = _all_expressions(2)
    by_split = {s: {e for e in expressions if tinytask.split_of(e) == s} for s in tinytask.SPLITS}
    assert sum(len(v) for v in by_split.values()) == len(expressions)
    assert 0.07 < len(by_split["test"]) / len(expressions) < 0.13
    assert 0.07 < len(by_split["dev"]) / len(expressions) < 0.13
    drawn = {}
    for split in tinytask.SPLITS:
        n = 200 if split != "train" else 1500
        drawn[split] = {p.meta["expression"] for p in tinytask.generate_problems(n, split, 2, seed=3)}
        assert drawn[split] <= by_split[split]
        assert len(drawn[split]) == n
    assert not (drawn["train"] & drawn["test"]) and not (drawn["train"] & drawn["dev"]) and not (drawn["dev"] & drawn["test"])
    # A different seed draws other problems but from the same side of the split.
    other = {p.meta["expression"] for p in tinytask.generate_problems(200, "test", 2, seed=99)}
    assert other <= by_split["test"] and not (other & drawn["train"])


def test_gold_matches_python_evaluation_and_gold_solutions_grade_correct() -> None:
    problems = tinytask.generate_problems(300, "train", (1, 2, 3), seed=1)
    for p in problems:
        assert int(p.gold) == eval(p.meta["expression"])  # naive reference: Python's precedence rules
        solution = gold_solution(p)
        assert solution.endswith(f"\\boxed{{{p.gold}}}")
        assert tinytask.grade(solution, p.gold) == 1.0
    assert sum(tinytask.grade(gold_solution(p), p.gold) for p in problems) == len(problems)


def test_wrong_answers_grade_zero() -> None:
    problems = tinytask.generate_problems(200, "dev", (2, 3), seed=2)
    order_matters = [p for p in problems if p.meta["order_matters"]]
    assert order_matters, "the generator should produce precedence-sensitive problems"
    rng = random.Random(0)
    for p in problems:
        assert tinytask.grade(f"1+1=2;\\boxed{{{int(p.gold) + 1}}}", p.gold) == 0.0
    for p in order_matters:
        left_to_right = tinytask.demonstration(p, rng, order_error=1.0)
        assert tinytask.grade(left_to_right, p.gold) == 0.0
    for bad in ("", "4*5=20;3+20=23", "\\boxed{}", "\\boxed{x}", "\\boxed{23", "\\boxed{22}"):
        assert tinytask.grade(bad, "23") == 0.0


def test_grade_is_math_reward_with_a_boxed_answer() -> None:
    # On every completion with a boxed answer the task grade equals math_reward's default; it differs only where
    # math_reward would fall back to the last number of an unboxed text.
    rng = random.Random(5)
    problems = tinytask.generate_problems(200, "train", (2, 3), seed=5)
    texts = [(tinytask.demonstration(p, rng, 0.5, 0.5), p.gold) for p in problems]
    texts += [("\\boxed{023}", "23"), ("\\boxed{ 23 }", "23"), ("\\boxed{23}\\boxed{5}", "23"), ("\\boxed{-5}", "-5")]
    for text, gold in texts:
        assert tinytask.grade(text, gold) == math_reward(text, gold)
    assert math_reward("4*5=20;3+20=23", "23") == 1.0 and tinytask.grade("4*5=20;3+20=23", "23") == 0.0


def test_noisy_demonstrations_have_the_requested_error_rates() -> None:
    rng = random.Random(0)
    problems = tinytask.generate_problems(400, "train", 3, seed=0)
    clean = [tinytask.grade(tinytask.demonstration(p, rng), p.gold) for p in problems]
    assert sum(clean) == len(problems)
    noisy = [tinytask.grade(tinytask.demonstration(p, rng, digit_error=1.0), p.gold) for p in problems]
    # A corrupted digit changes an intermediate, which almost always changes the answer (x*1 and x+0 cannot hide it).
    assert sum(noisy) / len(problems) < 0.1
    order = [tinytask.demonstration(p, rng, order_error=1.0) for p in problems]
    agree = [tinytask.grade(t, p.gold) == 1.0 for t, p in zip(order, problems)]
    assert agree == [not p.meta["order_matters"] for p in problems]


def test_bad_arguments_raise() -> None:
    with pytest.raises(ValueError, match="split"):
        tinytask.generate_problems(5, "validation")
    with pytest.raises(ValueError, match="difficulty"):
        tinytask.generate_problems(5, "train", 0)
    with pytest.raises(ValueError, match="too many"):
        tinytask.generate_problems(10_000, "test", 1)
    with pytest.raises(ValueError, match="expression"):
        tinytask.make_problem("3+0*5")


def test_task_strings_round_trip_through_the_byte_tokenizer() -> None:
    from ictrl.models import build_byte_tokenizer

    tok = build_byte_tokenizer(chat_template=None)
    rng = random.Random(1)
    for p in tinytask.generate_problems(50, "train", (2, 3), seed=4):
        text = p.question + tinytask.demonstration(p, rng, 0.5, 0.5)
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert len(ids) == len(text.encode())  # byte-level, no merges: one token per byte
        assert tok.decode(ids) == text
