"""math-verify behind a guard: per-process counters, configuration, a result cache and a pool of worker processes
with a hard per-call deadline (see the package docstring for the design)."""

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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from ictrl.rewards.normalize import _fast_compare

logger = logging.getLogger(__name__)

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

