"""math-verify behind a guard: per-process counters, configuration, result caches and a pool of worker processes
with a per-call budget of CPU time (the package docstring gives the design; :mod:`ictrl.rewards.worker` the
worker's side)."""

from __future__ import annotations

import atexit
import json
import logging
import os
import queue
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ictrl.rewards.normalize import _fast_compare, strip_bold, strip_format_chars, verify_form

logger = logging.getLogger(__name__)

# Numeric power towers (9^{9^9}), exponents of 7+ digits (also in e-notation, which verify_form rewrites as a
# power of ten) and factorials of 5+ digits make sympy evaluate
# astronomically large integers, and "{{{1}}}" makes latex2sympy's parse time grow by ~0.2 s per level
# (measured); refusing them up front saves a full timeout. Not applied when the gold itself has the same shape.
# The worker's CPU budget remains the backstop for everything this misses. Written so that no two unbounded
# quantifiers over the same characters meet (linear time; see extraction.py).
_EXPLOSIVE = re.compile(
    r"\d\s*(?:\^|\*\*)\s*(?:[{(]\s*)?\d+\s*(?:\^|\*\*)"  # 9^9^9, 9^{9^9}
    r"|(?:\^|\*\*)\s*[{(]\s*\d+\s*(?:\^|\*\*)"  # (9^9)^(9^9)
    r"|(?:\^|\*\*)\s*(?:[{(]\s*)?[-+]?\d{7,}"  # 2^{1234567}
    r"|\d[eE][-+]?\d{7,}"  # 1e1234567
    r"|(?<!\d)\d{5,}\s*!"  # 99999!
    r"|\{\s*\{\s*\{"  # bare nested braces: latex2sympy's cost grows steeply with their depth
)


def _explosive(answer: str, gold: str) -> bool:
    return _EXPLOSIVE.search(answer) is not None and _EXPLOSIVE.search(gold) is None


# ----------------------------------------------------------------------------------------------------------
# Statistics and configuration
# ----------------------------------------------------------------------------------------------------------


@dataclass
class RewardStats:
    """Per-process counters of :func:`math_reward` (thread-safe increments)."""

    calls: int = 0
    no_answer: int = 0  # nothing extracted (or a refused box)
    rejected: int = 0  # extracted answer over max_answer_chars, or explosive
    fast_path: int = 0
    cache_hits: int = 0
    verify_calls: int = 0  # math-verify invocations
    timeouts: int = 0  # over the CPU budget
    cached_timeouts: int = 0  # a pair that timed out before: 0.0 at once
    stalls: int = 0  # over the wall-clock backstop (waiting for a worker, its start, or a stopped worker)
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
    timeout: float = 3.0  # CPU seconds of the worker per math-verify call
    wall_timeout: float = 60.0  # wall seconds per call, waiting for a worker and its start included
    workers: int = 1
    cache_size: int = 65536


_CONFIG = _Config()


def configure(
    *,
    guard: Literal["process", "inline"] | None = None,
    timeout: float | None = None,
    wall_timeout: float | None = None,
    workers: int | None = None,
    cache_size: int | None = None,
) -> None:
    """Set how math-verify is guarded (process-wide). Changing ``guard`` or ``workers`` restarts the pool.

    Args:
        guard: "process" (budgeted worker process; default) or "inline" (no limit; trusted input).
        timeout: CPU seconds a worker may spend on one math-verify call before it scores 0.0 and counts a timeout.
            CPU time, not wall time, so a loaded machine does not change a verdict.
        wall_timeout: wall-clock backstop for a whole call (waiting for a free worker, a fresh worker's start, the
            check); a call past it scores 0.0 and counts a stall. Generous: only a machine so overloaded that a
            worker makes no progress reaches it.
        workers: worker processes (parallel verification for callers that use threads).
        cache_size: entries in the (answer, gold) -> result LRU; 0 disables it. Timeouts are always remembered
            (4096 pairs), so the same bomb costs its budget once.
    """
    if guard is not None and guard not in ("process", "inline"):
        raise ValueError(f"guard: expected 'process' or 'inline', got {guard!r}")
    for name, value in (("timeout", timeout), ("wall_timeout", wall_timeout)):
        if value is not None and not value > 0:
            raise ValueError(f"{name}: must be > 0, got {value!r}")
    if workers is not None and workers < 1:
        raise ValueError(f"workers: must be >= 1, got {workers!r}")
    if cache_size is not None and cache_size < 0:
        raise ValueError(f"cache_size: must be >= 0, got {cache_size!r}")
    restart = (guard is not None and guard != _CONFIG.guard) or (workers is not None and workers != _CONFIG.workers)
    for name, value in (("guard", guard), ("timeout", timeout), ("wall_timeout", wall_timeout),
                        ("workers", workers), ("cache_size", cache_size)):
        if value is not None:
            setattr(_CONFIG, name, value)
    if restart:
        shutdown_workers()
    _CACHE.clear()
    _TIMED_OUT.clear()


class _LRU:
    def __init__(self, size: Callable[[], int]) -> None:
        self._data: OrderedDict[tuple[str, str], bool] = OrderedDict()
        self._size = size
        self._lock = threading.Lock()

    def get(self, key: tuple[str, str]) -> bool | None:
        with self._lock:
            hit = self._data.get(key)
            if hit is not None:
                self._data.move_to_end(key)
            return hit

    def put(self, key: tuple[str, str], value: bool) -> None:
        size = self._size()
        if size == 0:
            return
        with self._lock:
            self._data[key] = value
            while len(self._data) > size:
                self._data.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()


_CACHE = _LRU(lambda: _CONFIG.cache_size)
_TIMED_OUT = _LRU(lambda: 4096)

# ----------------------------------------------------------------------------------------------------------
# Worker processes
# ----------------------------------------------------------------------------------------------------------

_WORKER_SOURCE = Path(__file__).with_name("worker.py").read_text(encoding="utf-8")
# Wall seconds each worker sleeps before a check with its budget armed (0: never). Tests set it to stand in for a
# machine that gives the worker no CPU, which must change no verdict, and for a worker that never answers in time.
_IDLE_BEFORE_CHECK = 0.0
_BUDGET_SIGNALS = {-signal.SIGPROF, -getattr(signal, "SIGXCPU", signal.SIGPROF)}


class _Spawner:
    """Starts every worker of this process from one long-lived thread: ``PR_SET_PDEATHSIG`` fires when the
    *thread* that forked the child ends, so a worker started from a short-lived caller thread (a
    ThreadPoolExecutor's) would be killed with it while the process lives on."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self._jobs: queue.Queue[queue.Queue[Any]] = queue.Queue()
        threading.Thread(target=self._run, name="ictrl-verify-spawner", daemon=True).start()

    def _run(self) -> None:
        while True:
            reply = self._jobs.get()
            try:
                reply.put(subprocess.Popen(
                    [sys.executable, "-c", _WORKER_SOURCE, str(os.getpid())],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, bufsize=0,
                ))
            except BaseException as e:  # handed to the caller
                reply.put(e)

    def popen(self) -> subprocess.Popen[bytes]:
        reply: queue.Queue[Any] = queue.Queue(maxsize=1)
        self._jobs.put(reply)
        proc = reply.get()
        if isinstance(proc, BaseException):
            raise proc
        return proc


_spawner: _Spawner | None = None
_spawner_lock = threading.Lock()


def _spawn() -> subprocess.Popen[bytes]:
    global _spawner
    with _spawner_lock:
        if _spawner is None or _spawner.pid != os.getpid():  # threads do not survive fork
            _spawner = _Spawner()
    return _spawner.popen()


class _Worker:
    """One worker process answering JSON-line requests with "1"/"0" (protocol in :mod:`ictrl.rewards.worker`)."""

    def __init__(self) -> None:
        self.proc = _spawn()
        self.ready = False
        self._buf = b""
        _STATS.add(worker_starts=1)

    def _readline(self, deadline: float) -> bytes | None:
        """The next line; None past ``deadline`` (wall clock); BrokenPipeError when the worker has exited."""
        fd = self.proc.stdout.fileno()  # type: ignore[union-attr]
        while b"\n" not in self._buf:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], remaining)
            if not ready:
                return None
            chunk = os.read(fd, 4096)
            if not chunk:
                raise BrokenPipeError("verify worker exited")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line

    def verify(self, answer: str, gold: str, budget: float, deadline: float) -> bool | str:
        """True/False; "timeout" (over the CPU budget: the worker is gone) or "stall" (past the wall deadline)."""
        if not self.ready:
            line = self._readline(deadline)
            if line is None:
                return "stall"
            if line != b"ready":
                raise BrokenPipeError("verify worker failed to start")
            self.ready = True
        try:
            request: dict[str, Any] = {"a": answer, "g": gold, "t": budget}
            if _IDLE_BEFORE_CHECK:
                request["idle"] = _IDLE_BEFORE_CHECK
            self.proc.stdin.write(json.dumps(request).encode() + b"\n")  # type: ignore[union-attr]
            line = self._readline(deadline)
        except BrokenPipeError:
            if self.proc.wait(timeout=5) in _BUDGET_SIGNALS:
                return "timeout"
            raise
        return "stall" if line is None else line == b"1"

    def kill(self) -> None:
        try:
            self.proc.kill()
            self.proc.wait(timeout=5)
        except Exception:  # already gone
            pass


class _Pool:
    """``size`` workers plus one warm spare, so a call after a timeout does not wait for a fresh worker's
    imports (about 1 s of CPU)."""

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

    def verify(self, answer: str, gold: str) -> bool | str:
        deadline = time.monotonic() + _CONFIG.wall_timeout
        try:
            w = self.idle.get(timeout=_CONFIG.wall_timeout)
        except queue.Empty:
            return "stall"
        try:
            result = w.verify(answer, gold, _CONFIG.timeout, deadline)
        except (BrokenPipeError, OSError, ValueError, subprocess.TimeoutExpired):
            result = False
            _STATS.add(errors=1)
            w = self._replace(w)
        else:
            if isinstance(result, str):
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

    def pids(self) -> list[int]:
        """Process ids of this pool's workers and spare."""
        with self._lock:
            return [w.proc.pid for w in self.all + ([self.spare] if self.spare else [])]

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
    """Whether an already extracted ``answer`` equals ``gold`` (fast path, caches, then guarded math-verify)."""
    answer, gold = strip_bold(strip_format_chars(answer)), strip_bold(strip_format_chars(gold))
    decided = _fast_compare(answer, gold)
    if decided is not None:
        _STATS.add(fast_path=1)
        return decided
    key = (answer, gold)
    hit = _CACHE.get(key)
    if hit is not None:
        _STATS.add(cache_hits=1)
        return hit
    if _TIMED_OUT.get(key) is not None:
        _STATS.add(cached_timeouts=1)
        return False
    _STATS.add(verify_calls=1)
    a, g = verify_form(answer), verify_form(gold)
    if _CONFIG.guard == "inline":
        from ictrl.rewards.worker import equivalent

        logging.getLogger("math_verify").setLevel(logging.ERROR)
        try:
            result: bool | str = equivalent(a, g)
        except Exception:
            result = False
    else:
        result = _get_pool().verify(a, g)
    if result == "timeout":
        _STATS.add(timeouts=1)
        _TIMED_OUT.put(key, True)
        logger.warning("math-verify used its %.1f s of CPU on an answer of %d chars", _CONFIG.timeout, len(answer))
        return False
    if result == "stall":
        _STATS.add(stalls=1)
        logger.warning("math-verify: no verdict within the %.0f s wall-clock backstop (machine overloaded?)",
                       _CONFIG.wall_timeout)
        return False
    assert isinstance(result, bool)
    _CACHE.put(key, result)
    return result
