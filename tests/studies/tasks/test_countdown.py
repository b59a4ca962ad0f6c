"""The countdown study task (studies/tasks/countdown.py): the chain grader, splits, demonstrations' error kinds, the
TRL reward, and the registry resolving it by its module path."""

from __future__ import annotations

import random

import pytest

from ictrl.experiments.tasks.registry import get_task, task_recipe
from studies.tasks import countdown


def test_grader_checks_the_chain_not_the_number() -> None:
    gold = "2,3,5,7>13"
    assert countdown.grade("7+5=12;12-2=10;10+3=13;", gold) == 1.0
    assert countdown.grade("3+2=5;5+5=10;10-7=3;", "2,3,5,7>3") == 1.0  # 5 given and 5 made: both usable
    assert countdown.grade("12-2=10;7+5=12;10+3=13;", gold) == 0.0  # 12 not available yet
    assert countdown.grade("5+7=12;3-2=1;12+1=13", gold) == 1.0  # another valid order, no trailing ';'
    assert countdown.grade("13", gold) == 0.0  # copying the target scores nothing
    assert countdown.grade("7+5=12;12-2=10;10+3=14;", gold) == 0.0  # wrong arithmetic
    assert countdown.grade("7+5=12;12-2=10;", gold) == 0.0  # 3 unused
    assert countdown.grade("7+5=12;12-2=10;10+3=13;13-3=10;", gold) == 0.0  # 3 used twice
    assert countdown.grade("2*5=10;10+7=17;17-3=14;", "2,3,5,7>14") == 0.0  # only + and -
    assert countdown.grade("", gold) == 0.0
    assert countdown.grade("2-7=-5;-5-3=-8;-8+5=-3;", "2,3,5,7>-3") == 1.0  # negatives parse


def test_problems_are_reachable_split_disjoint_and_seeded() -> None:
    test = countdown.generate_problems(200, "test", seed=0)
    dev = countdown.generate_problems(200, "dev", seed=0)
    assert {p.gold for p in test}.isdisjoint({p.gold for p in dev})
    assert len({p.gold for p in test}) == 200
    assert [p.id for p in test] == [p.id for p in countdown.generate_problems(200, "test", seed=0)]
    for p in test:
        assert countdown.grade(countdown.gold_solution(p), p.gold) == 1.0
        assert p.meta["solutions"] == len(countdown.solutions(tuple(p.meta["numbers"]), p.meta["target"]))
    # Branching: most problems have more than one valid chain.
    assert sum(p.meta["solutions"] > 1 for p in test) > 150
    with pytest.raises(ValueError, match="holds"):
        countdown.generate_problems(10_000, "test")


def test_demonstrations_err_by_choice_with_correct_arithmetic() -> None:
    problems = countdown.generate_problems(200, "train", seed=1)
    rng = random.Random(0)
    demos = [countdown.demonstration(p, rng, order_error=1.0, digit_error=0.0) for p in problems]
    # Every step is right arithmetic over the given numbers; the chain only ends elsewhere.
    for p, d in zip(problems, demos):
        assert countdown.grade(d, p.gold) == 0.0
        final = int(d.rstrip(";").split(";")[-1].split("=")[1])
        assert countdown.grade(d, countdown.problem_key(tuple(p.meta["numbers"]), final)) == 1.0
    clean = [countdown.demonstration(p, rng, 0.0, 0.0) for p in problems]
    assert all(countdown.grade(d, p.gold) == 1.0 for p, d in zip(problems, clean))


def test_reward_signature_and_task_registry() -> None:
    task = get_task("studies.tasks.countdown")
    assert task is countdown and get_task("studies.tasks:countdown") is countdown
    assert task.reward([""] * 2, ["7+5=12;12-2=10;10+3=13;", "x"], gold=["2,3,5,7>13"] * 2) == [1.0, 0.0]
    assert task.reward.__name__ == "countdown_reward" and task.reward.__module__ == "studies.tasks.countdown"
    assert get_task("tinyarith").reward([""], ["4*5=20;3+20=23;\\boxed{23}"], gold=["23"]) == [1.0]
    with pytest.raises(ValueError, match="unknown task 'nope'"):
        get_task("nope")
    with pytest.raises(ValueError, match="unknown task 'countdown'.*No module named 'countdown'"):
        get_task("countdown")  # not the package's any more: its module path, from a clone's root
    # The module's own default difficulty and warm-start overrides, which the registry holds none of.
    assert task_recipe("studies.tasks.countdown") == {
        "task": "studies.tasks.countdown", "difficulty": (4,), "order_error": 0.5, "digit_error": 0.1,
        "train_problems": 1300, "patience": 12, "max_steps": 4000}
