"""The rewards: ``fn(completion, gold) -> 0.0 | 1.0`` for math, GSM8K, multiple choice and format."""

from __future__ import annotations

import re

from ictrl.rewards.extraction import (
    _BOX_RE,
    DEFAULT_EXTRACTOR,
    MathExtractor,
    _strip_delimiters,
    extract_choice,
    last_boxed,
)
from ictrl.rewards.normalize import parse_number, strip_format_chars
from ictrl.rewards.verify import _STATS, _explosive, verify_answer



def _check_text(name: str, value: object) -> str:
    """``value``, a str, without invisible format characters (:func:`strip_format_chars`)."""
    if not isinstance(value, str):
        raise ValueError(f"{name}: expected str, got {type(value).__name__}")
    return strip_format_chars(value)


def _gold_text(gold: object) -> str:
    if isinstance(gold, bool) or not isinstance(gold, (str, int, float)):
        raise ValueError(f"gold: expected str or number, got {type(gold).__name__}")
    gold = strip_format_chars(str(gold)).strip()
    if not gold:
        raise ValueError("gold: empty")
    return gold


def math_reward(completion: str, gold: str, *, extractor: MathExtractor | None = None) -> float:
    """1.0 if the completion's final answer is mathematically equivalent to ``gold`` (a LaTeX or plain answer).

    Extraction and verification are described in the module docstring. Never raises on a bad completion;
    a timeout, an over-long answer or no answer all score 0.0.
    """
    completion = _check_text("completion", completion)
    gold = _strip_delimiters(_gold_text(gold))
    ex = extractor or DEFAULT_EXTRACTOR
    _STATS.add(calls=1)
    answer = ex.extract(completion)
    if answer is None:
        _STATS.add(no_answer=1)
        return 0.0
    if len(answer) > ex.max_answer_chars or _explosive(answer, gold):
        _STATS.add(rejected=1)
        return 0.0
    return 1.0 if verify_answer(answer, gold) else 0.0




def gsm8k_gold(gold: str) -> str:
    """The final answer of a GSM8K gold: the text after the last "####" (or ``gold`` itself)."""
    gold = _gold_text(gold)
    return gold.rsplit("####", 1)[-1].strip() if "####" in gold else gold


def gsm8k_reward(completion: str, gold: str, *, extractor: MathExtractor | None = None) -> float:
    """1.0 if the completion's final answer equals the GSM8K gold numerically (exact rational comparison).

    ``gold`` may be the raw GSM8K answer (the number after "####" is used). "$1,080.00", "1080 dollars" and
    "\\boxed{1080}" all equal 1080.
    """
    completion = _check_text("completion", completion)
    target = parse_number(gsm8k_gold(gold))
    if target is None:
        raise ValueError(f"gold: no number in {gold!r}")
    answer = (extractor or DEFAULT_EXTRACTOR).extract(completion)
    if answer is None or len(answer) > 1000:
        return 0.0
    value = parse_number(answer)
    return 1.0 if value is not None and value == target else 0.0



def choice_reward(completion: str, gold_letter: str) -> float:
    """1.0 if the letter extracted by :func:`extract_choice` equals ``gold_letter`` (A-J, case-insensitive)."""
    completion = _check_text("completion", completion)
    gold = _check_text("gold_letter", gold_letter).strip().strip("()").upper()
    if not re.fullmatch(r"[A-J]", gold):
        raise ValueError(f"gold_letter: expected one letter A-J, got {gold_letter!r}")
    return 1.0 if extract_choice(completion) == gold else 0.0


_TRAILER = re.compile(r"(?:\s|\$|\.|\\\]|\\\)|\*|</?answer>)*")


def format_reward(completion: str) -> float:
    """1.0 if the completion has exactly one ``\\boxed{...}``/``\\fbox{...}``, non-empty and balanced, and
    nothing but whitespace, "$", ".", "**", "\\]" or "\\)" after it; else 0.0."""
    completion = _check_text("completion", completion)
    boxes = list(_BOX_RE.finditer(completion))
    if len(boxes) != 1:
        return 0.0
    content = last_boxed(completion)
    if not content or not content.strip():
        return 0.0
    end = completion.find(content, boxes[0].end()) + len(content) + 1  # past the closing brace
    return 1.0 if _TRAILER.fullmatch(completion[end:]) else 0.0

