"""Normalisation of extracted answers and the fast path that decides most comparisons without math-verify.

Numbers are read exactly (:class:`fractions.Fraction` times a power of ten, never materialised when the exponent is
long) in every written form a benchmark uses: thousands separators (``870,000,000``, ``870{,}000``, ``870\\,000``),
e-notation (``8.7e8``), ``8.7 \\times 10^{8}`` / ``8.7 \\cdot 10^{8}`` / ``10^{8}``, a currency sign, and a trailing
unit in ``\\text{}``/``\\mathrm{}``/``\\mbox{}`` or degrees (MATH and Minerva strip units before comparing).
math-verify reads ``8.7e8`` as ``8.7 * e * 8`` (Euler's number), so e-notation is rewritten before it sees an answer.
Bold (``\\mathbf``, ``\\textbf``, ``\\boldsymbol``, ``\\bm``) is typography and is dropped, and so are invisible
format characters (:func:`strip_format_chars`), as the whitespace NBSP is.
"""

from __future__ import annotations

import functools
import re
import unicodedata
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
    r"(?:[eE](?P<e>[-+]?\d+)|(?:\\times|\\cdot|\*|×|·|x)10\^(?:\{(?P<b1>[-+]?\d+)\}|(?P<d1>\d)))?"
    r"|10\^(?:\{(?P<b2>[-+]?\d+)\}|(?P<d2>\d)))"
)
_E_NOTATION = re.compile(r"(?<![\w\\.])(\d+(?:\.\d+)?|\.\d+)[eE]([-+]?\d+)(?![\w.])")
_MAX_EXPONENT = 400  # 10^400 is a 401-digit integer: exact and cheap to write out; longer ones stay a power
_BOLD = re.compile(r"\\(?:mathbf|textbf|boldsymbol|bm)\s*(?=\{)")


def strip_format_chars(s: str) -> str:
    """``s`` without Unicode format characters (category Cf: U+200B zero width space, U+FEFF, U+200E, the soft
    hyphen U+00AD, U+200C, U+2060 ...): invisible, so a gold pasted with one looks like its clean answer, and no
    model's answer could ever equal it. NBSP and the other spaces are whitespace, which normalisation drops too."""
    return s if s.isascii() else _format_chars().sub("", s)


def first_format_char(s: str) -> str | None:
    """The first format character in ``s`` (see :func:`strip_format_chars`), or None."""
    found = None if s.isascii() else _format_chars().search(s)
    return found.group(0) if found else None


@functools.cache
def _format_chars() -> re.Pattern[str]:
    """A character class of every Cf code point this Python's Unicode tables know (all lie in planes 0, 1 and 14:
    scanning those takes milliseconds, the whole range a third of a second)."""
    ranges: list[list[int]] = []
    for code in (c for plane in (range(0x20000), range(0xE0000, 0xE1000)) for c in plane):
        if unicodedata.category(chr(code)) == "Cf":
            if ranges and ranges[-1][1] == code - 1:
                ranges[-1][1] = code
            else:
                ranges.append([code, code])
    return re.compile("[" + "".join(f"{re.escape(chr(a))}-{re.escape(chr(b))}" for a, b in ranges) + "]")


@dataclass(frozen=True)
class Numeric:
    """An answer that is one number, ``mantissa * 10**exponent`` exactly, and how it was written: ``decimals`` is
    the count of digits after the point of a number written without a power of ten (0 for an integer), None for
    one written with a power of ten."""

    mantissa: Fraction
    exponent: int
    decimals: int | None

    @property
    def value(self) -> Fraction | None:
        """The value as one fraction; None when the exponent is too long to write out (over 400 digits)."""
        if abs(self.exponent) > _MAX_EXPONENT:
            return None
        return self.mantissa * Fraction(10) ** self.exponent

    def key(self) -> tuple[Fraction, int]:
        """``(m, e)`` with value ``m * 10**e``, unique for the value: ``m``'s denominator has no factor 2 or 5 and
        its numerator no factor 10. Two numbers are equal exactly when their keys are, however long the exponents:
        the loops run a few times per digit of the mantissa, never per unit of the exponent."""
        m, e = self.mantissa, self.exponent
        if m == 0:
            return Fraction(0), 0
        d, shift = m.denominator, 0
        while d % 2 == 0 or d % 5 == 0:  # 1/8 = 125 * 10^-3
            d //= 2 if d % 2 == 0 else 5
            shift += 1
        m, e = m * 10**shift, e - shift
        n = m.numerator
        while n % 10 == 0:
            n //= 10
            e += 1
        return Fraction(n, m.denominator), e


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
    try:
        mantissa = Fraction(m["mant"] or "1")
        exponent = int(exp_text) if exp_text is not None else 0
    except ValueError:  # over int()'s 4300-digit limit for a string: not an answer anyone graded
        return None
    if m["sign"] == "-":
        mantissa = -mantissa
    mant = m["mant"] or ""
    decimals = None if exp_text is not None else len(mant) - mant.index(".") - 1 if "." in mant else 0
    return Numeric(mantissa, exponent, decimals)


def strip_bold(s: str) -> str:
    """``s`` without bold commands: ``\\mathbf{X}`` becomes the group ``{X}``, and a group that is the whole
    answer becomes ``X`` (math-verify reads a lone ``{0.5}`` as a set, ``\\mathbf{0.5}`` as a symbol)."""
    t = _BOLD.sub("", s)
    if t == s:
        return s
    for _ in range(4):  # \mathbf{\boldsymbol{x}}; a bounded number of passes keeps this linear
        t = t.strip()
        if not (t.startswith("{") and _group_end(t) == len(t) - 1):
            break
        t = t[1:-1]
    return t


def _group_end(s: str) -> int:
    """Index of the brace that closes the group opened at ``s[0]``; -1 when it never closes."""
    depth = 0
    for i, c in enumerate(s):
        if c == "{" and (i == 0 or s[i - 1] != "\\"):
            depth += 1
        elif c == "}" and s[i - 1] != "\\":
            depth -= 1
            if depth == 0:
                return i
    return -1


def _normalize(s: str) -> str:
    s = _NORM_DROP.sub("", s).replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    return _ONE_CHAR_GROUP.sub(r"\1\2", s).rstrip(".")


def _fast_compare(answer: str, gold: str) -> bool | None:
    """True/False when the answer is decided without math-verify; None when math-verify must decide.

    Two single numbers are decided here, exactly, in every written form: math-verify rounds both to 6 decimals,
    so it would call 0.0000002 and 0.0000001, or 0.5000001 and 0.5, equal. A decimal states its digits; a gold that
    is itself rounded is a matter for an answer that is not a decimal (:func:`ictrl.rewards.worker.equivalent`).
    """
    if _normalize(answer) == _normalize(gold):
        return True
    a, g = numeric(answer), numeric(gold)
    if a is None or g is None:
        return None
    return a.key() == g.key()


def _fraction_text(v: Fraction) -> str:
    sign = "-" if v < 0 else ""
    return str(v.numerator) if v.denominator == 1 else f"{sign}\\frac{{{abs(v.numerator)}}}{{{v.denominator}}}"


def verify_form(s: str) -> str:
    """``s`` as math-verify should read it: a single number in its exact form (``870000000``,
    ``\\frac{87}{10000}``, ``3\\times 10^{99999}`` past 400 digits of exponent), a plain decimal as its digits
    (``0.50``; the worker reads it exactly), e-notation inside an expression as ``\\times 10^{n}``, a trailing unit
    removed."""
    n = numeric(s)
    if n is not None and n.decimals:  # the worker tells a gold's decimals from the text
        scaled = abs(n.mantissa) * 10**n.decimals
        whole, frac = divmod(scaled.numerator, 10**n.decimals)
        return f"{'-' if n.mantissa < 0 else ''}{whole}.{frac:0{n.decimals}d}"
    if n is not None:
        v = n.value
        if v is not None:
            return _fraction_text(v)
        m, e = n.key()
        return f"{_fraction_text(m)}\\times 10^{{{e}}}"
    return _E_NOTATION.sub(r"\1\\times 10^{\2}", strip_units(s))


_GSM_NUM = re.compile(r"-?\d+(?:\.\d+)?(?:/\d+)?")
_FRAC_RE = re.compile(r"\\[dt]?frac\{(-?\d+)\}\{(\d+)\}")


def parse_number(text: str) -> Fraction | None:
    """The number in ``text``: the whole text when it is one number in any form :func:`numeric` reads (so
    ``8.7e8`` is 870000000; None past 400 digits of exponent), else the first number, tolerating $ signs,
    thousands commas, units, "\\frac{a}{b}" and "a/b"."""
    whole = numeric(text.strip())
    if whole is not None:
        return whole.value  # None for an exponent too long to write out: no GSM8K gold is such a number
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
