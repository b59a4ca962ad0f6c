"""Text of an error for one line: a long value cut short, an exception with the file and line it came from.
Standard library only, for the core and the command layer alike."""

from __future__ import annotations

import re


def shorten(text: str, limit: int = 600) -> str:
    """``text`` cut to ``limit`` characters, saying how long it was."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def failure(exc: BaseException) -> str:
    """``exc`` in a phrase for one line: its type, its first line, and the file and line it was raised at (a
    ``SyntaxError``'s own, else the last frame of its traceback outside the import machinery)."""
    text = exc.msg if isinstance(exc, SyntaxError) else str(exc)
    first = shorten(next((p.strip() for p in re.split(r"[\r\n]+", str(text)) if p.strip()), ""), 300)
    where = ""
    if isinstance(exc, SyntaxError) and exc.filename:
        where = f" ({exc.filename}, line {exc.lineno})"
    elif exc.__traceback__ is not None:
        tb = exc.__traceback__
        while tb.tb_next is not None:
            tb = tb.tb_next
        if not tb.tb_frame.f_code.co_filename.startswith("<frozen"):
            where = f" ({tb.tb_frame.f_code.co_filename}, line {tb.tb_lineno})"
    return f"{type(exc).__name__}: {first}{where}" if first else f"{type(exc).__name__}{where}"
