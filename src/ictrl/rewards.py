"""Verifiable rewards: math (math-verify), GSM8K (numeric), multiple choice (letter), format.

Every reward is a plain callable ``fn(completion: str, gold: str) -> float`` returning 0.0 or 1.0;
:func:`trl_reward` wraps one into TRL's batched signature ``(prompts, completions, **columns) -> list[float]``.

Design of :func:`math_reward` (the only reward that can be slow)
-----------------------------------------------------------------
RL training grades thousands of completions per step, and completions are adversarial by accident (a model
that writes ``9^{9^{9^9}}`` or a 100k-character box). math-verify's own timeouts use ``SIGALRM``, which fails
outside the main thread and is unsafe inside libraries, so they are always disabled here
(``parsing_timeout=None``, ``timeout_seconds=None``) and replaced by the pipeline below:

1. **Extraction** (in-process, linear time): the last ``\\boxed{...}``/``\\fbox{...}`` with balanced braces
   (only the last 8 boxes are tried, nesting deeper than ``max_brace_depth`` is refused), else the last
   "The answer is X" / "answer: X", else the last number; the order is a :class:`MathExtractor` option.
2. **Pre-checks**: an extracted answer longer than ``max_answer_chars`` (default 1000; the longest gold in
   MATH train is 159 characters), or holding a numeric power tower (``9^{9^9}``), a 7+-digit exponent, a
   5+-digit factorial or three bare nested braces ``{{{`` (unless the gold has the same shape), scores 0.0
   without being parsed. Golds in MATH/MATH-500 nest braces at most 2 deep; boxes deeper than 12 are refused.
3. **Fast path** (microseconds): equal after light LaTeX normalisation -> 1.0; both plain integers -> exact
   comparison decides; both plain decimals and equal -> 1.0. Anything else goes to math-verify.
4. **Cache**: a bounded LRU over ``(answer, gold)`` (a group of G samples often repeats answers).
5. **math-verify in a persistent worker process** with a hard per-call deadline (default 3 s). The worker is a
   plain ``python -c`` subprocess (not ``multiprocessing``), so it works from threads, from forked or
   daemonic pool workers (which may not have ``multiprocessing`` children) and under any start method. On
   overrun the worker is killed (SIGKILL: a big-integer power cannot be interrupted in-process) and a warm
   spare takes its place (a new spare starts); the call returns 0.0 and counts a timeout. The worker's address
   space is capped (``RLIMIT_AS``, 4 GiB) so a memory bomb dies as a MemoryError. One pool per process,
   re-created after ``fork``; ``configure(workers=N)`` lets N threads verify in parallel.

Measured on the 2-core dev machine: a worker round trip costs ~0.13 ms median (0.02 ms inline) on a cached
parse when idle; under heavy load (load average ~12) math-verify calls on MATH-500 wrong answers took p50 1.7 ms
guarded vs 0.7 ms inline, p99 324 vs 230 ms -- sympy, not the guard, dominates the tail. About 70% of MATH-500
gradings never reach math-verify (fast path). A call that overruns costs the timeout; the next call finds a warm
spare worker. ``configure(guard="inline")`` runs math-verify in-process with no timeout, for
trusted inputs only. Counters: :func:`reward_stats` (per process).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import queue
import re
import select
import subprocess
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Literal

logger = logging.getLogger(__name__)

# ----------------------------------------------------------------------------------------------------------
# Extraction
# ----------------------------------------------------------------------------------------------------------

EXTRACTION_STEPS = ("boxed", "answer_is", "last_number")
_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
_ANSWER_IS_RE = re.compile(r"(?i:answer)\s*(?:is|:)\s*:?\s*")
_NUMBER_RE = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?(?:/\d+)?")
_MAX_BOXES_TRIED = 8


@dataclass(frozen=True)
class MathExtractor:
    """How the final answer is found in a completion.

    Args:
        order: extraction steps tried in turn; each of "boxed", "answer_is", "last_number".
        max_answer_chars: an extracted answer longer than this is refused (reward 0.0, never parsed).
        max_brace_depth: a box nested deeper than this is refused (guards the parser's recursion).
    """

    order: tuple[str, ...] = EXTRACTION_STEPS
    max_answer_chars: int = 1000
    max_brace_depth: int = 12

    def __post_init__(self) -> None:
        object.__setattr__(self, "order", tuple(self.order))
        bad = [s for s in self.order if s not in EXTRACTION_STEPS]
        if bad or not self.order:
            raise ValueError(f"order: unknown or empty extraction steps {bad!r}; choose from {EXTRACTION_STEPS}")
        if self.max_answer_chars < 1 or self.max_brace_depth < 1:
            raise ValueError("max_answer_chars and max_brace_depth must be >= 1")

    def extract(self, text: str) -> str | None:
        """The final answer in ``text``, stripped of math delimiters, or None if no step finds one."""
        for step in self.order:
            if step == "boxed":
                found = last_boxed(text, self.max_brace_depth)
            elif step == "answer_is":
                found = _answer_is(text)
            else:
                found = _last_number(text)
            if found is not None:
                found = _strip_delimiters(found)
                if found:
                    return found
        return None


DEFAULT_EXTRACTOR = MathExtractor()


def last_boxed(text: str, max_depth: int = 12) -> str | None:
    """Content of the last complete ``\\boxed{...}``/``\\fbox{...}`` (or ``\\boxed 5``), else None.

    An unbalanced (truncated) last box falls back to the box before it; at most 8 boxes are tried so the cost
    stays linear in ``len(text)``.
    """
    starts = [m.end() for m in _BOX_RE.finditer(text)]
    for start in reversed(starts[-_MAX_BOXES_TRIED:]):
        i = start
        while i < len(text) and text[i] == " ":
            i += 1
        if i < len(text) and text[i] != "{":
            # "\boxed 5": the argument is the next token
            m = re.match(r"[^\s$]+", text[i:])
            if m and start != i:
                return m.group(0)
            continue
        depth = 0
        for j in range(i, len(text)):
            c = text[j]
            if c == "{" and (j == 0 or text[j - 1] != "\\"):
                depth += 1
                if depth > max_depth:
                    break
            elif c == "}" and text[j - 1] != "\\":
                depth -= 1
                if depth == 0:
                    return text[i + 1 : j]
    return None


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
# Fast path
# ----------------------------------------------------------------------------------------------------------

_NORM_DROP = re.compile(r"\\left|\\right|\\!|\\,|\\;|\\:|\\ |\s+|\$")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?:\D|$))")
_INT_RE = re.compile(r"-?\d+")
_DEC_RE = re.compile(r"-?\d*\.?\d+")


def _normalize(s: str) -> str:
    s = _NORM_DROP.sub("", s).replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    return s.rstrip(".")


# Numeric power towers (9^{9^9}), exponents of 7+ digits and factorials of 5+ digits make sympy evaluate
# astronomically large integers, and "{{{1}}}" makes latex2sympy's parse time grow by ~0.2 s per level
# (measured); refusing them up front saves a full timeout. Not applied when the gold
# itself has the same shape. The worker deadline remains the backstop for everything this misses.
_EXPLOSIVE = re.compile(
    r"\d\s*(?:\^|\*\*)\s*[{(]?\s*\d+\s*(?:\^|\*\*)"  # 9^9^9, 9^{9^9}
    r"|(?:\^|\*\*)\s*[{(]\s*\d+\s*(?:\^|\*\*)"  # (9^9)^(9^9)
    r"|(?:\^|\*\*)\s*[{(]?\s*\d{7,}"  # 2^{1234567}
    r"|\d{5,}\s*!"  # 99999!
    r"|\{\s*\{\s*\{"  # bare nested braces: latex2sympy's cost grows steeply with their depth
)


def _explosive(answer: str, gold: str) -> bool:
    return _EXPLOSIVE.search(answer) is not None and _EXPLOSIVE.search(gold) is None


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


# ----------------------------------------------------------------------------------------------------------
# Statistics and configuration
# ----------------------------------------------------------------------------------------------------------


@dataclass
class RewardStats:
    """Per-process counters of :func:`math_reward` (thread-safe increments)."""

    calls: int = 0
    no_answer: int = 0  # nothing extracted
    rejected: int = 0  # extracted answer over max_answer_chars
    fast_path: int = 0
    cache_hits: int = 0
    verify_calls: int = 0  # math-verify invocations
    timeouts: int = 0
    errors: int = 0  # worker crashed or failed to start
    worker_starts: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **counts: int) -> None:
        with self._lock:
            for k, v in counts.items():
                setattr(self, k, getattr(self, k) + v)

    def as_dict(self) -> dict[str, int]:
        with self._lock:
            return {k: v for k, v in vars(self).items() if not k.startswith("_")}


_STATS = RewardStats()


def reward_stats() -> dict[str, int]:
    """A snapshot of this process's :class:`RewardStats` counters."""
    return _STATS.as_dict()


def reset_reward_stats() -> None:
    with _STATS._lock:
        for k in list(vars(_STATS)):
            if not k.startswith("_"):
                setattr(_STATS, k, 0)


@dataclass
class _Config:
    guard: Literal["process", "inline"] = "process"
    timeout: float = 3.0
    workers: int = 1
    startup_timeout: float = 120.0
    cache_size: int = 65536


_CONFIG = _Config()


def configure(
    *,
    guard: Literal["process", "inline"] | None = None,
    timeout: float | None = None,
    workers: int | None = None,
    cache_size: int | None = None,
) -> None:
    """Set how math-verify is guarded (process-wide). Changing ``guard`` or ``workers`` restarts the pool.

    Args:
        guard: "process" (hard deadline in a worker process; default) or "inline" (no timeout; trusted input).
        timeout: seconds allowed per math-verify call before it scores 0.0 and counts a timeout.
        workers: worker processes (parallel verification for callers that use threads).
        cache_size: entries in the (answer, gold) -> result LRU; 0 disables it.
    """
    if guard is not None and guard not in ("process", "inline"):
        raise ValueError(f"guard: expected 'process' or 'inline', got {guard!r}")
    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout: must be > 0, got {timeout!r}")
    if workers is not None and workers < 1:
        raise ValueError(f"workers: must be >= 1, got {workers!r}")
    if cache_size is not None and cache_size < 0:
        raise ValueError(f"cache_size: must be >= 0, got {cache_size!r}")
    restart = (guard is not None and guard != _CONFIG.guard) or (workers is not None and workers != _CONFIG.workers)
    for name, value in (("guard", guard), ("timeout", timeout), ("workers", workers), ("cache_size", cache_size)):
        if value is not None:
            setattr(_CONFIG, name, value)
    if restart:
        shutdown_workers()
    _CACHE.clear()


class _LRU:
    def __init__(self) -> None:
        self._data: OrderedDict[tuple[str, str], bool] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[str, str]) -> bool | None:
        with self._lock:
            hit = self._data.get(key)
            if hit is not None:
                self._data.move_to_end(key)
            return hit

    def put(self, key: tuple[str, str], value: bool) -> None:
        if _CONFIG.cache_size == 0:
            return
        with self._lock:
            self._data[key] = value
            while len(self._data) > _CONFIG.cache_size:
                self._data.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()


_CACHE = _LRU()

# ----------------------------------------------------------------------------------------------------------
# math-verify, in-process or in a guarded worker process
# ----------------------------------------------------------------------------------------------------------

_MEMORY_LIMIT = 4 << 30

# The worker imports only math_verify, so it does not depend on how ictrl itself was made importable.
_WORKER_SOURCE = f"""
import json, logging, sys
try:
    import resource
    resource.setrlimit(resource.RLIMIT_AS, ({_MEMORY_LIMIT}, {_MEMORY_LIMIT}))
except Exception:
    pass
logging.disable(logging.CRITICAL)
from functools import lru_cache
from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
CFG = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]
@lru_cache(maxsize=4096)
def P(s):
    return parse("\\\\boxed{{" + s + "}}", extraction_config=CFG, parsing_timeout=None)
out, inp = sys.stdout.buffer, sys.stdin.buffer
out.write(b"ready\\n"); out.flush()
for line in inp:
    try:
        req = json.loads(line)
        ok = verify(P(req["g"]), P(req["a"]), timeout_seconds=None)
        out.write(b"1\\n" if ok else b"0\\n")
    except BaseException:
        out.write(b"0\\n")
    out.flush()
"""

_inline_lock = threading.Lock()
_inline_parse: Callable[[str], Any] | None = None


def _verify_inline(answer: str, gold: str) -> bool:
    """math-verify in this process, no timeout. The same parse/verify calls as the worker."""
    global _inline_parse
    with _inline_lock:
        if _inline_parse is None:
            from functools import lru_cache

            from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

            logging.getLogger("math_verify").setLevel(logging.ERROR)
            cfg = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]
            _inline_parse = lru_cache(maxsize=4096)(
                lambda s: parse("\\boxed{" + s + "}", extraction_config=cfg, parsing_timeout=None)
            )
    from math_verify import verify

    try:
        return bool(verify(_inline_parse(gold), _inline_parse(answer), timeout_seconds=None))
    except Exception:
        return False


class _Worker:
    """One ``python -c`` subprocess answering JSON-line requests with "1"/"0"."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _WORKER_SOURCE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            bufsize=0,
        )
        self.ready = False
        self._buf = b""
        _STATS.add(worker_starts=1)

    def _readline(self, deadline: float) -> bytes | None:
        import time

        fd = self.proc.stdout.fileno()  # type: ignore[union-attr]
        while b"\n" not in self._buf:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], remaining)
            if not ready:
                return None
            chunk = os.read(fd, 4096)
            if not chunk:  # worker died
                raise BrokenPipeError("verify worker exited")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line

    def verify(self, answer: str, gold: str, timeout: float) -> bool | None:
        """True/False, or None on timeout (the caller then replaces this worker)."""
        import time

        if not self.ready:
            if self._readline(time.monotonic() + _CONFIG.startup_timeout) != b"ready":
                raise BrokenPipeError("verify worker failed to start")
            self.ready = True
        self.proc.stdin.write(json.dumps({"g": gold, "a": answer}).encode() + b"\n")  # type: ignore[union-attr]
        line = self._readline(time.monotonic() + timeout)
        if line is None:
            return None
        return line == b"1"

    def kill(self) -> None:
        try:
            self.proc.kill()
            self.proc.wait(timeout=5)
        except Exception:  # already gone
            pass


class _Pool:
    """``size`` workers plus one warm spare, so a call after a timeout does not wait for a fresh worker's
    imports (about 1 s, more under load)."""

    def __init__(self, size: int) -> None:
        self.pid = os.getpid()
        self.idle: queue.Queue[_Worker] = queue.Queue()
        self.all: list[_Worker] = []
        self.spare: _Worker | None = None
        self._lock = threading.Lock()
        for _ in range(size):
            w = _Worker()
            self.all.append(w)
            self.idle.put(w)

    def verify(self, answer: str, gold: str) -> bool | None:
        w = self.idle.get()
        try:
            result = w.verify(answer, gold, _CONFIG.timeout)
        except (BrokenPipeError, OSError, ValueError):
            result = False
            _STATS.add(errors=1)
            w = self._replace(w)
        else:
            if result is None:
                w = self._replace(w)
            elif self.spare is None:
                with self._lock:  # start the spare once the pool has proved it works
                    if self.spare is None:
                        self.spare = _Worker()
        self.idle.put(w)
        return result

    def _replace(self, w: _Worker) -> _Worker:
        w.kill()
        with self._lock:
            new, self.spare = (self.spare or _Worker()), _Worker()
            self.all = [new if x is w else x for x in self.all]
        return new

    def close(self) -> None:
        if self.pid == os.getpid():  # never kill a parent's workers from a forked child
            for w in self.all + ([self.spare] if self.spare else []):
                w.kill()


_pool: _Pool | None = None
_pool_lock = threading.Lock()


def _get_pool() -> _Pool:
    global _pool
    with _pool_lock:
        if _pool is None or _pool.pid != os.getpid():
            _pool = _Pool(_CONFIG.workers)
        return _pool


def shutdown_workers() -> None:
    """Stop this process's verify workers (they restart on the next call)."""
    global _pool
    with _pool_lock:
        if _pool is not None:
            _pool.close()
        _pool = None


atexit.register(shutdown_workers)


def verify_answer(answer: str, gold: str) -> bool:
    """Whether an already extracted ``answer`` equals ``gold`` (fast path, cache, then guarded math-verify)."""
    decided = _fast_compare(answer, gold)
    if decided is not None:
        _STATS.add(fast_path=1)
        return decided
    key = (answer, gold)
    hit = _CACHE.get(key)
    if hit is not None:
        _STATS.add(cache_hits=1)
        return hit
    _STATS.add(verify_calls=1)
    if _CONFIG.guard == "inline":
        result: bool | None = _verify_inline(answer, gold)
    else:
        result = _get_pool().verify(answer, gold)
    if result is None:
        _STATS.add(timeouts=1)
        logger.warning("math-verify timed out after %.1fs on an answer of %d chars", _CONFIG.timeout, len(answer))
        return False
    _CACHE.put(key, result)
    return result


# ----------------------------------------------------------------------------------------------------------
# Rewards
# ----------------------------------------------------------------------------------------------------------


def _check_text(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{name}: expected str, got {type(value).__name__}")
    return value


def _gold_text(gold: object) -> str:
    if isinstance(gold, bool) or not isinstance(gold, (str, int, float)):
        raise ValueError(f"gold: expected str or number, got {type(gold).__name__}")
    gold = str(gold).strip()
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


_L = r"([A-J])"
_CHOICE_EXPLICIT = [
    re.compile(r"\\boxed\{\s*(?:\\text(?:bf)?\{)?\s*\(?" + _L + r"\)?\s*\}"),
    re.compile(r"(?i:answer)[\s*]*(?:(?i:is)|:)[\s*:]*(?:(?i:option|choice)\s*)?\$?\(?" + _L + r"(?![A-Za-z0-9])"),
    re.compile(r"(?i:answer)[\s*]*(?:(?i:is)|:)[\s*:]*\$?\\(?:text|mathrm)\{\(?" + _L + r"\)?\}"),
]
_CHOICE_PAREN = re.compile(r"\(" + _L + r"\)")


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
    m = re.fullmatch(r"\s*\(?" + _L + r"[).]?\s*", completion)
    return m.group(1) if m else None


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


# ----------------------------------------------------------------------------------------------------------
# TRL adapter
# ----------------------------------------------------------------------------------------------------------


def completion_text(completion: str | Sequence[dict[str, Any]]) -> str:
    """Plain text of a TRL completion: a string, or a conversational list of {"role", "content"} messages
    (the content of the last message; content parts of type "text" are joined)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Sequence) and completion and isinstance(completion[-1], dict):
        content = completion[-1].get("content", "")
        if isinstance(content, str):
            return content
        if isinstance(content, Sequence):
            return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    if isinstance(completion, Sequence) and not completion:
        return ""
    raise ValueError(f"completions: expected str or list of messages, got {type(completion).__name__}")


def trl_reward(
    fn: Callable[..., float], gold_column: str | None = "answer", name: str | None = None
) -> Callable[..., list[float]]:
    """Wrap ``fn(completion, gold) -> float`` as a TRL reward ``f(prompts, completions, **columns) -> list``.

    The gold comes from the dataset column ``gold_column`` (TRL passes every extra column as a keyword); with
    ``gold_column=None`` ``fn`` takes the completion only (e.g. :func:`format_reward`). ``__name__`` is
    ``name`` or ``fn.__name__``: TRL logs each reward under it.
    """
    label = name or getattr(fn, "__name__", "reward")

    def reward(
        prompts: Sequence[Any] | None = None, completions: Sequence[Any] | None = None, **kwargs: Any
    ) -> list[float]:
        if completions is None:
            raise ValueError(f"{label}: completions is required")
        texts = [completion_text(c) for c in completions]
        if gold_column is None:
            return [float(fn(t)) for t in texts]
        if gold_column not in kwargs:
            raise ValueError(f"{label}: gold column {gold_column!r} missing; got columns {sorted(kwargs)}")
        golds = kwargs[gold_column]
        if len(golds) != len(texts):
            raise ValueError(f"{label}: {len(texts)} completions but {len(golds)} values in {gold_column!r}")
        return [float(fn(t, g)) for t, g in zip(texts, golds)]

    reward.__name__ = reward.__qualname__ = label
    return reward


make_trl_reward = trl_reward

REWARDS: dict[str, Callable[..., float]] = {
    "math": math_reward,
    "gsm8k": gsm8k_reward,
    "choice": choice_reward,
    "format": format_reward,
}


def get_reward(kind: str) -> Callable[..., float]:
    """The reward for a benchmark kind ("math", "gsm8k", "choice") or "format"."""
    if kind not in REWARDS:
        raise ValueError(f"kind: unknown reward {kind!r}; choose from {sorted(REWARDS)}")
    return REWARDS[kind]


def trl_kind_reward(
    gold_column: str = "answer", kind_column: str = "kind", name: str = "verifiable_reward"
) -> Callable[..., list[float]]:
    """A TRL reward for mixed data sets: each row's ``kind_column`` ("math", "gsm8k", "choice") picks the
    reward applied to it (see :func:`ictrl.data.to_trl_dataset`, which writes that column)."""

    def reward(
        prompts: Sequence[Any] | None = None, completions: Sequence[Any] | None = None, **kwargs: Any
    ) -> list[float]:
        if completions is None:
            raise ValueError(f"{name}: completions is required")
        for col in (gold_column, kind_column):
            if col not in kwargs or len(kwargs[col]) != len(completions):
                raise ValueError(f"{name}: column {col!r} missing or not one value per completion")
        return [
            float(get_reward(k)(completion_text(c), g))
            for c, g, k in zip(completions, kwargs[gold_column], kwargs[kind_column])
        ]

    reward.__name__ = reward.__qualname__ = name
    return reward
