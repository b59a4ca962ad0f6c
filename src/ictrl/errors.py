"""The user-error exceptions the ``ictrl`` command line turns into one line and exit status 2.

A :class:`UserError` says what the person running a command got wrong (a path, a name, a row of a file, a
missing optional package) in one line that names the file, line, field or option. ``ictrl.cli.main`` prints it
as ``ictrl COMMAND: error: MESSAGE`` with no traceback unless ``--debug`` is given; anything else is a bug and
keeps its traceback. They subclass ValueError so callers that already catch ValueError keep working.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable, Iterator

from ictrl.core.describe import failure, shorten


class UserError(ValueError):
    """A mistake in the user's input; the message is one line naming where it is."""


class DataError(UserError):
    """A data file or data row that cannot be used: the message names the file, line and field."""


class ConfigError(UserError):
    """A bad key or value in a run config; the message names the key and its source."""


class ModelNotFoundError(UserError):
    """A model path or hub id with no local copy and no way to fetch one."""


class WriteError(UserError):
    """A file the run could not write (a full disk, a quota): the message names the path and the free space, and
    what was kept."""


class MissingExtraError(UserError):
    """An optional package the chosen option needs is not installed; the message names the pip extra."""


MESSAGE_LIMIT = 2000  # a last bound; messages quote values through quote() below


def one_line(message: object) -> str:
    """``message`` as a single line: newlines folded into "; " so a terminal shows one line per error."""
    # "\n" and "\r" only: str.splitlines also splits at U+0085, U+2028 and others a quoted key or value may hold
    parts = [p.strip() for p in re.split(r"[\r\n]+", str(message)) if p.strip()]
    text = "; ".join(parts) or type(message).__name__
    return shorten(text, MESSAGE_LIMIT)


QUOTE_LIMIT = 200


def did_you_mean(name: str, choices: Iterable[str], cutoff: float = 0.6) -> str:
    """``; did you mean 'X'?`` for the closest of ``choices`` to ``name`` (difflib's ratio at least ``cutoff``),
    else '': the end of a one-line error naming an unknown key, option value or name."""
    import difflib

    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=cutoff)
    return f"; did you mean {close[0]!r}?" if close else ""


def quote(value: object, limit: int = QUOTE_LIMIT) -> str:
    """``repr(value)`` cut to about ``limit`` characters, built with bounded work (at most 8 items of a container,
    3 levels deep), so an error that quotes a huge or deeply shared value (a YAML alias expansion, a megabyte
    string) stays one short line."""
    text = _bounded_repr(value, 3, limit)
    return text if len(text) <= limit else text[:limit] + "..."


def _bounded_repr(value: object, depth: int, limit: int) -> str:
    if isinstance(value, str):
        return repr(value[:limit]) + ("..." if len(value) > limit else "")
    if isinstance(value, (list, tuple, dict)):
        if depth == 0:
            return "[...]" if isinstance(value, list) else "(...)" if isinstance(value, tuple) else "{...}"
        items = list(value.items())[:8] if isinstance(value, dict) else list(value[:8])
        parts = [f"{_bounded_repr(k, depth - 1, limit)}: {_bounded_repr(v, depth - 1, limit)}" for k, v in items] \
            if isinstance(value, dict) else [_bounded_repr(v, depth - 1, limit) for v in items]
        if len(value) > 8:
            parts.append("...")
        left, right = "{}" if isinstance(value, dict) else "()" if isinstance(value, tuple) else "[]"
        return left + ", ".join(parts) + right
    try:
        return repr(value)[: limit + 1]
    except ValueError:  # an int past sys.get_int_max_str_digits() has no repr
        return f"<{type(value).__name__} too large to show>"


class Interrupted(Exception):
    """Ctrl-C during a run: ``ictrl.cli.main`` prints ``message`` (what was kept, how to go on) and exits with
    ``status``: 130 (128 + SIGINT)."""

    status = 130

    def __init__(self, message: str) -> None:
        super().__init__(message)


class Terminated(Interrupted):
    """SIGTERM (what Slurm and Kubernetes send before SIGKILL): one line as for Ctrl-C, exit status 143
    (128 + SIGTERM, as a process killed by it reports)."""

    status = 143


@contextlib.contextmanager
def sigterm_raises(message: str = "terminated (SIGTERM)") -> Iterator[None]:
    """Inside the block SIGTERM raises :class:`Terminated` where the main thread is (as Ctrl-C raises
    KeyboardInterrupt), so the caller's cleanup and one line run instead of a silent exit 143. A no-op outside the
    main thread, where Python cannot set a handler."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handle(signum: int, frame: object) -> None:
        raise Terminated(message)

    previous = signal.signal(signal.SIGTERM, handle)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def interrupts_once() -> Iterator[None]:
    """Inside the block the first Ctrl-C raises KeyboardInterrupt as always; every later one is absorbed, so the
    shutdown the first one started (the trainer's cleanup, the lock, the one line naming the checkpoint) runs to
    its end instead of ending in a second KeyboardInterrupt's traceback. The handler found is restored on exit.
    A no-op outside the main thread."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def absorb(signum: int, frame: object) -> None:
        pass  # the run is already stopping: the one line comes when it has

    def first(signum: int, frame: object) -> None:
        signal.signal(signal.SIGINT, absorb)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, first)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


# Set by `ictrl train --num-processes` (ictrl.train_cli.launch) for the processes it starts: a file rank 0 writes its
# exit status to once it has printed the run's one line, so the launching parent adds nothing of its own.
REPORTED_FILE_ENV = "ICTRL_REPORTED_FILE"


def note_reported(status: int) -> None:
    """Record that this process printed the run's one line and exits with ``status`` (see ``REPORTED_FILE_ENV``;
    a no-op outside ``ictrl train --num-processes``)."""
    import os

    path = os.environ.get(REPORTED_FILE_ENV)
    if path:
        try:
            with open(path, "w") as f:
                f.write(str(status))
        except OSError:  # the parent then names the failed process itself
            pass
