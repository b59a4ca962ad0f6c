"""Light normalisation of extracted answers and the fast path that decides most comparisons without math-verify."""

from __future__ import annotations

import re
from fractions import Fraction

_NORM_DROP = re.compile(r"\\left|\\right|\\!|\\,|\\;|\\:|\\ |\s+|\$")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?:\D|$))")
_INT_RE = re.compile(r"-?\d+")
_DEC_RE = re.compile(r"-?\d*\.?\d+")


def _normalize(s: str) -> str:
    s = _NORM_DROP.sub("", s).replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    return s.rstrip(".")


def _fast_compare(answer: str, gold: str) -> bool | None:
    """True/False when the answer is decided without math-verify; None when math-verify must decide."""
    a, g = _normalize(answer), _normalize(gold)
    if a == g:
        return True
    a, g = _THOUSANDS.sub("", a), _THOUSANDS.sub("", g)
    if _INT_RE.fullmatch(a) and _INT_RE.fullmatch(g):
        return int(a) == int(g)
    if _DEC_RE.fullmatch(a) and _DEC_RE.fullmatch(g) and Fraction(a) == Fraction(g):
        return True
    return None



_GSM_NUM = re.compile(r"-?\d+(?:\.\d+)?(?:/\d+)?")
_FRAC_RE = re.compile(r"\\[dt]?frac\{(-?\d+)\}\{(\d+)\}")


def parse_number(text: str) -> Fraction | None:
    """The first number in ``text``, tolerating $ signs, thousands commas, units, "\\frac{a}{b}" and "a/b"."""
    s = text.replace("\u2212", "-").replace("\\$", "").replace("$", "").replace("{,}", ",").replace("\\,", "")
    s = _FRAC_RE.sub(r"\1/\2", s)
    s = _THOUSANDS.sub("", s)
    s = re.sub(r"(?<=-)\s+", "", s)
    m = _GSM_NUM.search(s)
    if m is None:
        return None
    try:
        return Fraction(m.group(0))
    except (ValueError, ZeroDivisionError):
        return None
