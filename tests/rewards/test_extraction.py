"""Extraction: boxes, "the answer is", last number, choice letters."""

from __future__ import annotations

import pytest

from ictrl.rewards import MathExtractor, extract_choice, last_boxed



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

