"""The rewards: math, GSM8K, choice and format verdicts, and a gold round trip over the real benchmark files."""

from __future__ import annotations

import random
import re

import pytest

from ictrl import rewards
from ictrl.rewards import choice_reward, format_reward, gsm8k_reward, math_reward

# ------------------------------------------------------------------------------------------- math_reward


@pytest.mark.parametrize(
    ("completion", "gold", "expected"),
    [
        ("Thus \\boxed{\\frac{1}{2}}.", "0.5", 1.0),
        ("Thus \\boxed{0.5}.", "\\frac12", 1.0),
        ("The answer is $\\dfrac{1}{2}$.", "\\frac{1}{2}", 1.0),
        ("\\boxed{1,000}", "1000", 1.0),
        ("\\boxed{x^2 + 2x + 1}", "(x+1)^2", 1.0),
        ("\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}", "\\left( 3, \\frac{\\pi}{2} \\right)", 1.0),
        ("\\boxed{(3, \\pi/2)}", "\\left( 3, \\frac{\\pi}{2} \\right)", 1.0),
        ("\\boxed{12}", "13", 0.0),
        ("\\boxed{\\frac{1}{3}}", "0.5", 0.0),
        ("\\boxed{x+1}", "x+2", 0.0),
        ("I am not sure.", "5", 0.0),
        ("", "5", 0.0),
    ],
)
def test_math_reward(completion: str, gold: str, expected: float) -> None:
    assert math_reward(completion, gold) == expected


def test_math_reward_rejects_bad_gold() -> None:
    with pytest.raises(ValueError, match="gold"):
        math_reward("\\boxed{1}", None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="gold"):
        math_reward("\\boxed{1}", "  ")
    with pytest.raises(ValueError, match="completion"):
        math_reward(b"\\boxed{1}", "1")  # type: ignore[arg-type]

# ------------------------------------------------------------------------------------- gsm8k, choice, format


@pytest.mark.parametrize(
    ("completion", "gold", "expected"),
    [
        ("She makes \\boxed{18} dollars.", "Janet sells 9 eggs.\n#### 18", 1.0),
        ("The answer is $18.", "18", 1.0),
        ("The answer is \\$18.00.", "18", 1.0),
        ("\\boxed{18.0}", "18", 1.0),
        ("\\boxed{\\$1,080}", "#### 1,080", 1.0),
        ("total: 1080 dollars", "1,080", 1.0),
        ("\\boxed{18 \\text{ dollars}}", "18", 1.0),
        ("\\boxed{-3}", "-3", 1.0),
        ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),
        ("The answer is 17.", "18", 0.0),
        ("\\boxed{180}", "18", 0.0),
        ("\\boxed{1.8}", "18", 0.0),
        ("no numbers here", "18", 0.0),
    ],
)
def test_gsm8k_reward(completion: str, gold: str, expected: float) -> None:
    assert gsm8k_reward(completion, gold) == expected


def test_gsm8k_reward_bad_gold() -> None:
    with pytest.raises(ValueError, match="gold"):
        gsm8k_reward("\\boxed{1}", "#### none")



def test_choice_reward() -> None:
    assert choice_reward("The answer is (B).", "B") == 1.0
    assert choice_reward("The answer is (B).", "b") == 1.0
    assert choice_reward("The answer is (B).", "C") == 0.0
    assert choice_reward("nothing", "A") == 0.0
    with pytest.raises(ValueError, match="gold_letter"):
        choice_reward("The answer is (B).", "K")


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("Reasoning... so $\\boxed{5}$.", 1.0),
        ("\\[\\boxed{\\frac{1}{2}}\\]", 1.0),
        ("no box", 0.0),
        ("\\boxed{1} and \\boxed{2}", 0.0),
        ("\\boxed{5} because of many reasons", 0.0),
        ("\\boxed{}", 0.0),
        ("\\boxed{5", 0.0),
    ],
)
def test_format_reward(completion: str, expected: float) -> None:
    assert format_reward(completion) == expected


# ------------------------------------------------------------------------------------------- real data


def _completion(kind: str, gold: str) -> str:
    if kind == "choice":
        return f"Let me think. The answer is ({gold})."
    return f"Let me think step by step. The answer is \\boxed{{{gold}}}."


def gold_roundtrip(problems: list, kind: str) -> tuple[list, list, int]:
    """(right answers graded wrong, other problems' golds graded right, number of wrong-gold checks).

    The wrong gold is the next problem's whose gold differs after removing whitespace."""
    reward = rewards.get_reward(kind)
    key = [re.sub(r"\s+", "", p.gold) for p in problems]
    right_fail, wrong_fail, checks = [], [], 0
    for i, p in enumerate(problems):
        if reward(_completion(kind, p.gold), p.gold) != 1.0:
            right_fail.append((p.id, p.gold))
        other = next((problems[(i + j) % len(problems)] for j in range(1, len(problems))
                      if key[(i + j) % len(problems)] != key[i]), None)
        if other is None:
            continue
        checks += 1
        if reward(_completion(kind, other.gold), p.gold) != 0.0:
            wrong_fail.append((p.id, p.gold, other.gold))
    return right_fail, wrong_fail, checks


ARC_ICL = ("jsonl:{root}/arc_challenge/arc_challenge.jsonl"
           ":kind=choice:question_field=query:answer_field=gold:choices_field=choices")
FAST_FILES = ["gsm8k", "gsm8k_train", "aime23", "aime24", "aime25", "mmlu_stem", "commonsenseqa", "arc_challenge",
              ARC_ICL]


def _check_roundtrip(spec: str, shared_data, sample: int | None = None) -> None:
    from ictrl.data import load_problems, parse_spec

    spec = spec.format(root=shared_data)
    problems = load_problems(spec, data_root=shared_data)
    if sample is not None:
        problems = random.Random(0).sample(problems, sample)
    kind = parse_spec(spec)[0].kind
    right_fail, wrong_fail, checks = gold_roundtrip(problems, kind)
    assert checks >= 0.9 * len(problems)
    assert len(right_fail) <= 0.01 * len(problems), right_fail[:20]
    assert len(wrong_fail) <= 0.01 * checks, wrong_fail[:20]


@pytest.mark.parametrize("spec", FAST_FILES)
def test_gold_roundtrip_real_data(spec: str, shared_data) -> None:
    _check_roundtrip(spec, shared_data)


@pytest.mark.integration
@pytest.mark.parametrize(("spec", "sample"), [("math500", None), ("math_train", 1000)])
def test_gold_roundtrip_real_data_math(spec: str, sample: int | None, shared_data) -> None:
    _check_roundtrip(spec, shared_data, sample)
