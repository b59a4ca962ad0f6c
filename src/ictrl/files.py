"""Atomic file writes: every result, summary, config and report in ictrl goes through these.

A crash mid-write must never leave a truncated file where a finished one was (or looked like it was), so each
write goes to a uniquely named temp file in the destination directory, is flushed and fsynced, then renamed over
the target with ``os.replace`` (atomic on POSIX within one filesystem).
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any
from collections.abc import Iterator


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (creating parent directories); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Opened with "x" rather than mkstemp so the file gets the umask's permissions, not mkstemp's 0600.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "xb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """UTF-8 text version of :func:`atomic_write_bytes`."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike[str], data: Any, indent: int = 2, **dump_kwargs: Any) -> Path:
    """``json.dumps(data)`` plus a trailing newline, written atomically."""
    return atomic_write_text(path, json.dumps(data, indent=indent, **dump_kwargs) + "\n")


def read_jsonl(path: str | os.PathLike[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Yield ``("FILE:LINE", object)`` for each non-blank line of a JSONL file.

    A line that is not a JSON object raises ValueError naming the file and line, so callers can add their own
    field checks with the same location prefix.
    """
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}, column {e.colno}: not valid JSON ({e.msg})") from None
            if not isinstance(obj, dict):
                raise ValueError(f"{where}: expected a JSON object, got {type(obj).__name__}")
            yield where, obj


def load_metrics(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Read a run's ``metrics.jsonl``: one JSON object per line (blank lines skipped)."""
    return [obj for _, obj in read_jsonl(path)]
