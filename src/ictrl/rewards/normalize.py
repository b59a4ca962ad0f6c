"""Normalisation of extracted answers and the fast path that decides most comparisons without math-verify.

Numbers are read exactly (:class:`fractions.Fraction`) in every written form a benchmark uses: thousands separators
(``870,000,000``, ``870{,}000``, ``870\\,000``), e-notation (``8.7e8``), ``8.7 \\times 10^{8}`` /
``8.7 \\cdot 10^{8}`` / ``10^{8}``, a currency sign, and a trailing unit in ``\\text{}``/``\\mathrm{}``/``\\mbox{}``
or degrees (MATH and Minerva strip units before comparing). math-verify reads ``8.7e8`` as ``8.7 * e * 8`` (Euler's
number), so e-notation is rewritten before it sees an answer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

_NORM_DROP = re.compile(r"\\left|\\right|\\!|\\,|\\;|\\:|\\ |\s+|\$")
# x^{2} -> x^2, E_{1} -> E_1: the same symbol whichever brace style the model used
_ONE_CHAR_GROUP = re.compile(r"([_^])\{(\w)\}")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?:\D|$))")

# A unit at the end: \text{ cm}, \mathrm{m/s}^2, \mbox{ inches}, ^\circ, degrees. Not \mathrm{i} or \mathrm{e}
# (constants), not a bare letter (a variable).
_UNIT_TAIL = re.compile(
    r"(?:\\(?:text|textrm|mathrm|mbox|rm|operatorname)\s*\{(?!\s*[ied]\s*\})\s*[A-Za-z%][^{}]*\}"
    r"(?:\s*\^\s*(?:\{\s*-?\d\s*\}|-?\d))?"
    r"|\^\s*(?:\{\s*\\circ\s*\}|\\circ)|\\circ|°|\\degree|degrees?)\s*$"
)
_SPACING = ("\\,", "\\;", "\\:", "\\!")
_DIGIT_GROUP_SEP = re.compile(r"(?<=\d)(?:,|\{,\}|\\,|\\ |\\;|~|\s)(?=\d{3}(?!\d))")
_NUMBER = re.compile(
    r"(?P<sign>[-+]?)(?:"
    r"(?P<mant>\d+(?:\.\d*)?|\.\d+)"
    r"(?:[eE](?P<e>[-+]?\d{1,4})|(?:\\times|\\cdot|\*|×|·|x)10\^(?:\{(?P<b1>[-+]?\d{1,4})\}|(?P<d1>\d)))?"
    r"|10\^(?:\{(?P<b2>[-+]?\d{1,4})\}|(?P<d2>\d)))"
)
_E_NOTATION = re.compile(r"(?<![\w\\.])(\d+(?:\.\d+)?|\.\d+)[eE]([-+]?\d{1,4})(?![\w.])")
_MAX_EXPONENT = 400  # 10^400 is a 401-digit integer: exact and cheap; beyond that leave the answer to the guard


@dataclass(frozen=True)
class Numeric:
    """An answer that is one number: its exact value, and whether it was written as an integer or with a power
    of ten (both make an exact comparison the benchmark's verdict)."""

    value: Fraction
    integer: bool
    exponent: bool


def _strip_spacing(s: str) -> str:
    """``s`` without trailing whitespace and spacing commands (str methods, not a "$"-anchored pattern, which
    would be quadratic in a run of spaces)."""
    while True:
        s = s.rstrip()
        if s.endswith("\\") and not s.endswith("\\\\"):  # the backslash of "\ "
            s = s[:-1]
        elif s.endswith(_SPACING):
            s = s[:-2]
        else:
            return s


def strip_units(s: str) -> str:
    """``s`` without a trailing unit (``\\text{ cm}``, ``\\mathrm{m/s}^2``, ``^\\circ``); ``s`` if nothing is left."""
    out = s.rstrip()
    for _ in range(3):  # "5\\,\\mathrm{m}\\,\\text{s}^{-1}" has two groups
        m = _UNIT_TAIL.search(out)
        if m is None or m.start() == 0:
            break
        out = _strip_spacing(out[: m.start()])
    return out or s


def numeric(s: str) -> Numeric | None:
    """The exact value of an answer that is a single number (any form in the module docstring), else None."""
    t = strip_units(s).replace("\\$", "").replace("$", "").replace("\u2212", "-").replace("\\!", "")
    t = _DIGIT_GROUP_SEP.sub("", t)
    t = re.sub(r"\s+", "", t)
    m = _NUMBER.fullmatch(t)
    if m is None:
        return None
    exp_text = next((m[k] for k in ("e", "b1", "d1", "b2", "d2") if m[k] is not None), None)
    exponent = int(exp_text) if exp_text is not None else 0
    if abs(exponent) > _MAX_EXPONENT:
        return None
    value = Fraction(m["mant"] or "1") * Fraction(10) ** exponent
    if m["sign"] == "-":
        value = -value
    integer = exp_text is None and "." not in (m["mant"] or "")
    return Numeric(value, integer, exp_text is not None)


def _normalize(s: str) -> str:
    s = _NORM_DROP.sub("", s).replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    return _ONE_CHAR_GROUP.sub(r"\1\2", s).rstrip(".")


def _fast_compare(answer: str, gold: str) -> bool | None:
    """True/False when the answer is decided without math-verify; None when math-verify must decide.

    Two numbers decide exactly when they are equal, when both are integers, or when either has a power of ten
    (math-verify rounds to 6 decimals, so it would call 1e-30 and 2e-30 equal). Unequal plain decimals
    (3.14 vs 3.14159) go on to math-verify, as before.
    """
    if _normalize(answer) == _normalize(gold):
        return True
    a, g = numeric(answer), numeric(gold)
    if a is None or g is None:
        return None
    if a.value == g.value:
        return True
    if (a.integer and g.integer) or a.exponent or g.exponent:
        return False
    return None


def verify_form(s: str) -> str:
    """``s`` as math-verify should read it: a single number in its exact form (``870000000``,
    ``\\frac{87}{10000}``), e-notation inside an expression as ``\\times 10^{n}``, a trailing unit removed."""
    n = numeric(s)
    if n is not None and (n.integer or n.exponent):  # a plain decimal keeps math-verify's own reading
        v = n.value
        sign = "-" if v < 0 else ""
        return str(v.numerator) if v.denominator == 1 else f"{sign}\\frac{{{abs(v.numerator)}}}{{{v.denominator}}}"
    return _E_NOTATION.sub(r"\1\\times 10^{\2}", strip_units(s))


_GSM_NUM = re.compile(r"-?\d+(?:\.\d+)?(?:/\d+)?")
_FRAC_RE = re.compile(r"\\[dt]?frac\{(-?\d+)\}\{(\d+)\}")


def parse_number(text: str) -> Fraction | None:
    """The number in ``text``: the whole text when it is one number in any form :func:`numeric` reads (so
    ``8.7e8`` is 870000000), else the first number, tolerating $ signs, thousands commas, units, "\\frac{a}{b}"
    and "a/b"."""
    whole = numeric(text.strip())
    if whole is not None:
        return whole.value
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
