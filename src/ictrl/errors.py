"""The user-error exceptions the ``ictrl`` command line turns into one line and exit status 2.

A :class:`UserError` says what the person running a command got wrong (a path, a name, a row of a file, a
missing optional package) in one line that names the file, line, field or option. ``ictrl.cli.main`` prints it
as ``ictrl COMMAND: error: MESSAGE`` with no traceback unless ``--debug`` is given; anything else is a bug and
keeps its traceback. They subclass ValueError so callers that already catch ValueError keep working.
"""

from __future__ import annotations


class UserError(ValueError):
    """A mistake in the user's input; the message is one line naming where it is."""


class DataError(UserError):
    """A data file or data row that cannot be used: the message names the file, line and field."""


class ModelNotFoundError(UserError):
    """A model path or hub id with no local copy and no way to fetch one."""


class MissingExtraError(UserError):
    """An optional package the chosen option needs is not installed; the message names the pip extra."""


def one_line(message: object) -> str:
    """``message`` as a single line: newlines folded into "; " so a terminal shows one line per error."""
    parts = [p.strip() for p in str(message).splitlines() if p.strip()]
    return "; ".join(parts) or type(message).__name__


class Interrupted(Exception):
    """Ctrl-C during a run: ``ictrl.cli.main`` prints ``message`` (what was kept, how to go on) and exits 130."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
