"""The math-verify side of the guard: the equivalence check itself, and the worker process that runs it.

:mod:`ictrl.rewards.verify` starts this file's source as ``python -c SOURCE PARENT_PID`` (so the worker imports only
the standard library and math_verify, however ictrl itself was made importable), and the inline guard imports
:func:`equivalent` from it, so both guards make the same calls.

Protocol: one JSON request per stdin line, ``{"a": answer, "g": gold, "t": cpu_seconds}`` (tests add ``"idle": s``,
seconds to sleep before the check); one reply line, ``1`` or ``0``. Limits, all enforced by the kernel, so they
hold while sympy holds the GIL inside one long C call:

- CPU time per request: ``ITIMER_PROF`` armed for ``t`` seconds of this process's CPU time; its signal, SIGPROF,
  keeps its default action (terminate), so a request over budget ends the worker, and the parent reads that as a
  timeout. Counting CPU time rather than wall time is what keeps a verdict independent of machine load.
  ``RLIMIT_CPU`` (a whole second past the same budget, SIGXCPU) backs it up.
- memory: ``RLIMIT_AS`` 4 GiB, so a memory bomb raises MemoryError (reply 0) instead of swapping the machine.
- parent death: ``PR_SET_PDEATHSIG`` = SIGKILL on Linux (the parent starts workers from one long-lived thread,
  because the signal follows the thread that forked), a thread polling ``os.getppid()`` elsewhere; stdin's EOF ends
  an idle worker either way.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import signal
import sys
import threading
import time
from functools import lru_cache
from typing import Any

MEMORY_LIMIT = 4 << 30
_PR_SET_PDEATHSIG = 1
# A gold written as a plain decimal with at least this many decimals is read as a rounded value against an answer
# with no decimal in it (docs/method-choices.md, "Decimals").
ROUNDED_GOLD_DECIMALS = 6
_PLAIN_DECIMAL = re.compile(r"-?\d*\.(\d+)")


@lru_cache(maxsize=1)
def _extraction_config() -> list[Any]:
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, LatexNormalizationConfig

    # units=False: math-verify's unit list holds single letters ("t", "s", "h", "c"), so "\frac{1}{m} t" was read as
    # "\frac{1}{m}" with a unit. ictrl strips units itself, only as a trailing \text{...} (normalize.strip_units).
    norm = LatexNormalizationConfig(basic_latex=True, units=False, malformed_operators=True, nits=True, boxed="all")
    return [LatexExtractionConfig(boxed_match_priority=0, normalization_config=norm), ExprExtractionConfig()]


@lru_cache(maxsize=4096)
def _parse(s: str) -> Any:
    from math_verify import parse

    return parse("\\boxed{" + s + "}", extraction_config=_extraction_config(), parsing_timeout=None)


def _exact(parsed: list[Any]) -> list[Any]:
    """``parsed`` with every float read as the exact decimal it was written as: math-verify compares a float by
    rounding both sides to 6 decimals, which calls 0.0000002 and 0.0000001 equal. A float's ``str`` gives back the
    digits written (latex2sympy keeps 15 significant digits, or every digit of a longer literal)."""
    from sympy import Basic, Float, MatrixBase, Rational
    from sympy.core.parameters import evaluate

    def fix(e: Any) -> Any:
        floats = e.atoms(Float) if isinstance(e, Basic) else ()
        if not floats:
            return e
        with evaluate(False):  # as latex2sympy built it: rebuilt evaluated, Eq(x, [1/2, 1]) would become False
            return e.xreplace({f: Rational(str(f)) for f in floats})

    return [x.applyfunc(fix) if isinstance(x, MatrixBase) else fix(x) for x in parsed]


def _has_float(parsed: list[Any]) -> bool:
    from sympy import Basic, Float, MatrixBase

    return any(isinstance(y, Basic) and y.has(Float)
               for x in parsed for y in (x if isinstance(x, MatrixBase) else [x]))


def equivalent(answer: str, gold: str) -> bool:
    """math-verify's verdict on two extracted answers, every decimal read exactly (no timeout here: the caller
    bounds it). One tolerance: a gold written as a plain decimal with :data:`ROUNDED_GOLD_DECIMALS` or more
    decimals, against an answer with no decimal in it (``\\frac{1}{3}`` vs ``0.333333``, ``\\pi`` vs ``3.141593``),
    is the answer's value rounded to the gold's decimals; they match when the answer rounds to the gold."""
    from math_verify import verify

    parsed_answer, parsed_gold = _parse(answer), _parse(gold)
    m = _PLAIN_DECIMAL.fullmatch(gold)
    if m and len(m[1]) >= ROUNDED_GOLD_DECIMALS and not _has_float(parsed_answer):
        return bool(verify(parsed_gold, parsed_answer, float_rounding=len(m[1]), timeout_seconds=None))
    return bool(verify(_exact(parsed_gold), _exact(parsed_answer), timeout_seconds=None))


def die_with_parent(parent: int) -> None:
    """End this process (SIGKILL, from the kernel on Linux) when ``parent`` dies, so a killed parent leaves no
    orphan worker running on; the grid's run processes (``ictrl.experiments.grid.runner``) use it too."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl")
    except (OSError, AttributeError):  # not Linux

        def watch() -> None:
            while os.getppid() == parent:
                time.sleep(0.2)
            os._exit(1)

        threading.Thread(target=watch, daemon=True).start()
    if os.getppid() != parent:  # the parent died before the signal was armed
        os._exit(1)


def _arm(cpu_seconds: float) -> None:
    import resource

    used = time.process_time()
    soft = math.ceil(used + cpu_seconds) + 1
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    if hard == resource.RLIM_INFINITY or soft <= hard:
        resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
    signal.setitimer(signal.ITIMER_PROF, cpu_seconds)


def serve(parent: int) -> None:
    """The worker's main loop (see the module docstring)."""
    die_with_parent(parent)
    signal.signal(signal.SIGPROF, signal.SIG_DFL)
    signal.signal(signal.SIGXCPU, signal.SIG_DFL)
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    except (ImportError, ValueError, OSError):
        pass
    logging.disable(logging.CRITICAL)
    equivalent("1", "1")  # import and warm up math_verify before saying ready
    out, inp = sys.stdout.buffer, sys.stdin.buffer
    out.write(b"ready\n")
    out.flush()
    for line in inp:
        try:
            req = json.loads(line)
            _arm(float(req["t"]))
            if "idle" in req:  # wall seconds with no CPU used, the budget armed: how tests stand in for a machine
                time.sleep(float(req["idle"]))  # that gives the worker no CPU (no signals, no wall-clock asserts)
            ok = equivalent(req["a"], req["g"])
        except Exception:  # MemoryError, RecursionError, sympy's own errors: not equivalent
            ok = False
        finally:
            signal.setitimer(signal.ITIMER_PROF, 0)
        out.write(b"1\n" if ok else b"0\n")
        out.flush()


if __name__ == "__main__":
    serve(int(sys.argv[1]))
