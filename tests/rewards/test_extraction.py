"""Extraction: boxes, "the answer is", last number, choice letters."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from ictrl.rewards import (
    DEFAULT_EXTRACTOR,
    MathExtractor,
    choice_reward,
    extract_choice,
    format_reward,
    gsm8k_reward,
    last_boxed,
    math_reward,
)
from ictrl.rewards.normalize import numeric
from ictrl.rewards.verify import _explosive



@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("first \\boxed{1} then \\boxed{\\frac{2}{3}}.", "\\frac{2}{3}"),
        ("\\fbox{x^{2}+1}", "x^{2}+1"),
        ("nested \\boxed{\\left\\{1, 2\\right\\}}", "\\left\\{1, 2\\right\\}"),
        ("\\boxed 7 is it", "7"),
        ("ok \\boxed{5} but truncated \\boxed{\\frac{1}{", "5"),  # unbalanced last box -> previous box
        ("no box at all", None),
    ],
)
def test_last_boxed(text: str, expected: str | None) -> None:
    assert last_boxed(text) == expected


def test_extractor_order_and_fallbacks() -> None:
    ex = MathExtractor()
    assert ex.extract("So the answer is $\\frac{3}{4}$. Done") == "\\frac{3}{4}"
    assert ex.extract("Final Answer: The final answer is 12. I hope it is correct.") == "12"
    assert ex.extract("answer: 3.5") == "3.5"
    assert ex.extract("we get 3, then 1,024 apples") == "1024"
    text = "The answer is 9. Check: \\boxed{8}"
    assert ex.extract(text) == "8"
    assert MathExtractor(order=("answer_is", "boxed")).extract(text) == "9"
    assert MathExtractor(order=("boxed",)).extract("the answer is 4") is None
    with pytest.raises(ValueError, match="order"):
        MathExtractor(order=("boxed", "nonsense"))


@pytest.mark.parametrize(
    ("completion", "letter"),
    [
        ("The answer is (B).", "B"),
        ("Answer: C", "C"),
        ("answer: (D)", "D"),
        ("so the answer is E", "E"),
        ("\\boxed{B}", "B"),
        ("\\boxed{\\text{(C)}}", "C"),
        ("The correct answer is option J.", "J"),
        ("**Answer:** A", "A"),
        ("The answer is \\text{D}", "D"),
        ("(A) looks wrong, (B) looks wrong; so the answer is (C). Checking (A) again.", "C"),
        ("Answer: A. Wait, no. The answer is B.", "B"),
        ("Between (A) and (D) I pick (D)", "D"),
        ("B", "B"),
        ("the answer is Alice", None),
        ("a bit unclear", None),
    ],
)
def test_extract_choice(completion: str, letter: str | None) -> None:
    assert extract_choice(completion) == letter



# ------------------------------------------------------------------------------------------------ linear time


def _best_time(fn: Callable[[str], object], text: str, repeats: int = 3) -> float:
    """Best of ``repeats`` in CPU time of this process: a loaded machine deschedules it, which wall time would count."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.process_time()
        fn(text)
        best = min(best, time.process_time() - t0)
    return best


SPACES = {  # name -> (function of the text, text with n spaces where a backtracking pattern would re-split them)
    "choice_reward: box of spaces": (lambda t: choice_reward(t, "B"), lambda n: "\\boxed{" + " " * n + "x}"),
    "extract_choice: answer then spaces": (extract_choice, lambda n: "answer is" + " " * n + "?"),
    "extract_choice: spaces only": (extract_choice, lambda n: " " * n + "?"),
    "math extractor: answer then spaces": (DEFAULT_EXTRACTOR.extract, lambda n: "answer" + " " * n + "x"),
    "math_reward: box of spaces": (lambda t: math_reward(t, "5"), lambda n: "\\boxed{" + " " * n + "x^ }"),
    "gsm8k_reward: box of spaces": (lambda t: gsm8k_reward(t, "5"), lambda n: "\\boxed{" + " " * n + "x}"),
    "format_reward: box then spaces": (format_reward, lambda n: "\\boxed{5}" + " " * n + "x"),
    "numeric: unit then spaces": (numeric, lambda n: "5\\text{ cm}" + " " * n + "x"),
    "numeric: spaces then unit": (numeric, lambda n: "5" + " " * n + "\\text{ cm}x"),
    "explosive: power then spaces": (lambda t: _explosive(t, "1"), lambda n: "9^" + " " * n + "x"),
    "explosive: digits": (lambda t: _explosive(t, "1"), lambda n: "1" * n + "x"),
}


@pytest.mark.parametrize("name", sorted(SPACES))
def test_extraction_is_linear(name: str) -> None:
    # A quadratic backtracking regex once took 65 s on a box of 50k spaces. Time at n and 8n: a
    # linear function grows ~8x, a quadratic one ~64x; the bound 24 leaves room for noise on a loaded machine.
    fn, make = SPACES[name]
    small, large = _best_time(fn, make(1000)), _best_time(fn, make(8000))
    assert large < 24 * max(small, 2e-5), f"{name}: {small * 1e3:.2f} ms -> {large * 1e3:.2f} ms"


def test_choice_in_a_box_of_50k_spaces() -> None:
    assert choice_reward("\\boxed{" + " " * 50000 + "B}", "B") == 1.0
    assert choice_reward("\\boxed{" + " " * 50000 + "(C) }", "C") == 1.0
    assert extract_choice("The answer is" + " " * 50000 + "(D)") == "D"
