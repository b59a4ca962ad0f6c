"""Finding the final answer in a completion: math answers (box, "the answer is", last number) and choice letters.

Every function here is linear in the length of the text. Each pattern starts at a literal anchor (or at the
start of a run, by a look-behind), and no two unbounded quantifiers over the same characters are adjacent (not
even across an optional element): otherwise a failed match re-splits a run of spaces between them, which is
quadratic (``\\boxed{`` followed by 50k spaces took 65 s in ``extract_choice``). Possessive quantifiers would say
this directly but need Python 3.11.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated

from ictrl.validation import AT_LEAST_ONE, check_fields

EXTRACTION_STEPS = ("boxed", "answer_is", "last_number")
_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
_ANSWER_IS_RE = re.compile(r"(?i:answer)\s*(?:is|:)\s*(?::\s*)?")
_NUMBER_RE = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?(?:/\d+)?")
# Control characters, lone surrogates (undecodable bytes kept by "surrogateescape") and U+FFFD (bytes replaced on
# decoding): a text holding any is not prose, and a number in it says nothing about an answer.
_NOT_TEXT = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff\ufffd]")
_BARE_ARG = re.compile(r"[^\s$]+")
_MAX_BOXES_TRIED = 8


class _Refused:
    """A box was found but cannot be used (nested deeper than allowed, or every tried box is unbalanced)."""


REFUSED = _Refused()


@dataclass(frozen=True)
class MathExtractor:
    """How the final answer is found in a completion.

    Args:
        order: extraction steps tried in turn; each of "boxed", "answer_is", "last_number". A completion that holds a
            box the "boxed" step refuses has no answer: later steps are not tried (a refused box scores 0.0).
        max_answer_chars: an extracted answer longer than this is refused (reward 0.0, never parsed).
        max_brace_depth: a box nested deeper than this is refused (guards the parser's recursion).
    """

    order: tuple[str, ...] = EXTRACTION_STEPS
    max_answer_chars: Annotated[int, AT_LEAST_ONE] = 1000
    max_brace_depth: Annotated[int, AT_LEAST_ONE] = 12

    def __post_init__(self) -> None:
        object.__setattr__(self, "order", tuple(self.order))
        bad = [s for s in self.order if s not in EXTRACTION_STEPS]
        if bad or not self.order:
            raise ValueError(f"order: unknown or empty extraction steps {bad!r}; choose from {EXTRACTION_STEPS}")
        check_fields(self, types=False)

    def extract(self, text: str) -> str | None:
        """The final answer in ``text``, stripped of math delimiters, or None if no step finds one."""
        for step in self.order:
            if step == "boxed":
                found = find_box(text, self.max_brace_depth)
                if found is REFUSED:
                    return None
            elif step == "answer_is":
                found = _answer_is(text)
            else:
                found = _last_number(text)
            if isinstance(found, str):
                found = _strip_delimiters(found)
                if found:
                    return found
        return None


DEFAULT_EXTRACTOR = MathExtractor()


def find_box(text: str, max_depth: int = 12) -> str | _Refused | None:
    """Content of the last usable ``\\boxed{...}``/``\\fbox{...}`` (or ``\\boxed 5``); :data:`REFUSED` when
    the text has a box but none is usable; None when it has no box.

    An unbalanced (truncated) last box falls back to the box before it; a box nested deeper than ``max_depth`` is
    refused outright (no fallback past it). At most 8 boxes are tried, so the cost stays linear in ``len(text)``.
    """
    starts = [m.end() for m in _BOX_RE.finditer(text)]
    if not starts:
        return None
    for start in reversed(starts[-_MAX_BOXES_TRIED:]):
        i = start
        while i < len(text) and text[i] == " ":
            i += 1
        if i < len(text) and text[i] != "{":
            # "\boxed 5": the argument is the next token
            m = _BARE_ARG.match(text, i)
            if m and start != i:
                return m.group(0)
            continue
        depth = 0
        for j in range(i, len(text)):
            c = text[j]
            if c == "{" and (j == 0 or text[j - 1] != "\\"):
                depth += 1
                if depth > max_depth:
                    return REFUSED
            elif c == "}" and text[j - 1] != "\\":
                depth -= 1
                if depth == 0:
                    return text[i + 1 : j]
    return REFUSED


def last_boxed(text: str, max_depth: int = 12) -> str | None:
    """Content of the last usable ``\\boxed{...}``/``\\fbox{...}`` (or ``\\boxed 5``), else None (see
    :func:`find_box`)."""
    found = find_box(text, max_depth)
    return found if isinstance(found, str) else None


def _answer_is(text: str) -> str | None:
    last = None
    for last in _ANSWER_IS_RE.finditer(text):
        pass
    if last is None:
        return None
    rest = text[last.end() : last.end() + 2000]
    for open_, close in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if rest.startswith(open_):
            end = rest.find(close, len(open_))
            if end > 0:
                return rest[len(open_) : end]
    rest = rest.split("\n", 1)[0]
    # a sentence ends at ". " or a final "."; decimals like 3.5 keep their point
    rest = re.split(r"\.(?:\s|$)", rest, maxsplit=1)[0]
    return rest.strip()


def _last_number(text: str) -> str | None:
    """The last number in a text that reads as text: binary junk (control characters, undecodable bytes) has
    digits by chance, and crediting them rewards noise."""
    if _NOT_TEXT.search(text):
        return None
    last = None
    for last in _NUMBER_RE.finditer(text):
        pass
    return None if last is None else last.group(0).replace(",", "")


def _strip_delimiters(s: str) -> str:
    s = s.strip()
    for open_, close in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if s.startswith(open_) and s.endswith(close) and len(s) >= len(open_) + len(close):
            s = s[len(open_) : len(s) - len(close)].strip()
    return s.rstrip(".").strip()


# ----------------------------------------------------------------------------------------------------------
# Choice letters
# ----------------------------------------------------------------------------------------------------------

_L = r"([A-J])"
_CHOICE_EXPLICIT = [
    re.compile(r"\\boxed\{\s*(?:\\text(?:bf)?\{\s*)?\(?" + _L + r"\)?\s*\}"),
    re.compile(r"(?i:answer)[\s*]*(?:(?i:is)|:)[\s*:]*(?:(?i:option|choice)\s*)?\$?\(?" + _L + r"(?![A-Za-z0-9])"),
    re.compile(r"(?i:answer)[\s*]*(?:(?i:is)|:)[\s*:]*\$?\\(?:text|mathrm)\{\(?" + _L + r"\)?\}"),
]
_CHOICE_PAREN = re.compile(r"\(" + _L + r"\)")
_CHOICE_ALONE = re.compile(r"\s*\(?" + _L + r"[).]?\s*")


def extract_choice(completion: str) -> str | None:
    """The chosen letter A-J: the last explicit statement ("answer is (B)", "Answer: B", ``\\boxed{B}``),
    else the last parenthesised letter "(B)", else a completion that is just the letter."""
    best: tuple[int, str] | None = None
    for pattern in _CHOICE_EXPLICIT:
        for m in pattern.finditer(completion):
            if best is None or m.end() > best[0]:
                best = (m.end(), m.group(1))
    if best is not None:
        return best[1]
    last = None
    for last in _CHOICE_PAREN.finditer(completion):
        pass
    if last is not None:
        return last.group(1)
    m = _CHOICE_ALONE.fullmatch(completion)
    return m.group(1) if m else None
