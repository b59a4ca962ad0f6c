"""Atomic file writes: every result, summary, config and report in ictrl goes through these.

A crash mid-write must never leave a truncated file where a finished one was (or looked like it was), so each
write goes to a uniquely named temp file in the destination directory, is flushed and fsynced, then renamed over
the target with ``os.replace`` (atomic on POSIX within one filesystem).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shlex
import shutil
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any


# errno values that say the filesystem refused a write, not that a path is wrong
WRITE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO, errno.EFBIG)
# how torch's C++ writer and safetensors' Rust writer report a failed write (they raise no OSError)
WRITE_FAILURE_TEXT = ("No space left", "StorageFull", "Disk quota", "file write failed", "unexpected pos",
                      "Read-only file system", "Input/output error")


def free_space(path: str | os.PathLike[str]) -> str:
    """The free space of the filesystem holding ``path`` (its nearest existing parent), for an error message."""
    where = Path(path).absolute()
    while not where.exists() and where != where.parent:
        where = where.parent
    try:
        free = float(shutil.disk_usage(where).free)
    except OSError:
        return "free space unknown"
    unit = "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if free < 1024 or unit == "TiB":
            break
        free /= 1024
    return f"{free:.0f} B free" if unit == "B" else f"{free:.1f} {unit} free"


def is_write_failure(exc: BaseException) -> bool:
    """Whether ``exc`` says the filesystem refused a write (a full disk, a quota, a read-only mount)."""
    if isinstance(exc, OSError) and exc.errno in WRITE_ERRNOS:
        return True
    return not isinstance(exc, OSError) and any(text in str(exc) for text in WRITE_FAILURE_TEXT)


def write_error(path: str | os.PathLike[str], exc: BaseException, after: str = "") -> Exception:
    """The one-line :class:`ictrl.errors.WriteError` for a failed write of ``path``: the reason, the free space
    there and ``after`` (what was kept, how to go on)."""
    from ictrl.errors import WriteError

    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc).splitlines()[0][:200]
    return WriteError(f"cannot write {path}: {reason} ({free_space(path)}){'; ' + after if after else ''}")


@contextlib.contextmanager
def reported_write(path: str | os.PathLike[str], after: str | Callable[[], str] = "") -> Iterator[None]:
    """Turn a write failure (:func:`is_write_failure`) inside the block into :func:`write_error`'s one line;
    ``after`` may be a function, asked when the write fails (what is kept then, and so how to go on)."""
    try:
        yield
    except OSError as exc:
        if not is_write_failure(exc):
            raise
        raise write_error(exc.filename or path, exc, after() if callable(after) else after) from exc


def append_whole(fd: int, data: bytes) -> None:
    """Append ``data`` to the file open at ``fd``, all of it or, when a write fails (a full disk) or a signal's
    exception cuts it short, none: the file is cut back to its length before, so a reader never sees a torn line.
    The exception propagates."""
    start = os.lseek(fd, 0, os.SEEK_END)
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(fd, view):]
    except BaseException:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, start)
        raise


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
        # The cleanup must not raise over the write's own error: in a read-only folder the unlink fails too.
        with contextlib.suppress(OSError):
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
    with open(path, "rb") as fh:  # by bytes: a line that is not UTF-8 is named like one that is not JSON
        lines = fh.read().splitlines()  # at \n, \r\n and \r, as text mode's universal newlines
    for lineno, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"{where}: not UTF-8 (byte {e.start + 1})") from None
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}, column {e.colno}: not valid JSON ({e.msg})") from None
        except RecursionError:  # Python's parser recurses once per level of nesting
            raise ValueError(f"{where}: nested too deeply to read") from None
        if not isinstance(obj, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(obj).__name__}")
        yield where, obj


def read_json(path: str | os.PathLike[str], advice: str = "") -> Any:
    """The JSON document in ``path``, a file ictrl wrote and reads back; a torn or unreadable one is one
    :class:`ictrl.errors.UserError` line naming it, then ``advice`` (how to go on)."""
    from ictrl.errors import UserError

    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc).splitlines()[0][:200]
        raise UserError(f"{path}: cannot read it ({'not valid JSON: ' if isinstance(exc, ValueError) else ''}"
                        f"{reason}){'; ' + advice if advice else ''}") from None


def load_metrics(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Read a run's ``metrics.jsonl``: one JSON object per line (blank lines skipped)."""
    return [obj for _, obj in read_jsonl(path)]


# --- the output path every command checks ------------------------------------------------------------------


def check_output_dir(path: str | os.PathLike[str], label: str = "--output-dir", writes: Iterable[str] = (),
                     legacy: Callable[[Path], bool] | None = None, hint: str = "") -> None:
    """``path`` is, or can be made, a writable directory: not an existing file, not under a file, not in a
    directory this process cannot write; and of ``writes`` (the names the command writes there) none is a file
    ictrl did not write (:func:`check_own_files`, with ``legacy``; ``hint`` ends its line). Every command that
    writes a directory of results calls it with its other argument checks, before anything loads;
    :class:`ictrl.errors.UserError` names ``label``."""
    names = list(writes)
    if names:  # first: a folder holding another tool's files is the line to read, writable or not
        check_own_files(path, names, label, legacy, hint)
    _check_writable(path, label)


def _check_writable(path: str | os.PathLike[str], label: str) -> None:
    from ictrl.errors import UserError, quote

    out = Path(path).expanduser()
    shown = quote(str(path))
    if out.exists() or out.is_symlink():
        if not out.is_dir():
            kind = "a file" if out.is_file() else "not a directory"
            raise UserError(f"{label}: {shown} is {kind}; give a directory")
        failed = _write_error(out)
        if failed is not None:
            raise UserError(f"{label}: {shown} is not writable" + (f": {failed.strerror}" if failed.strerror else ""))
        return
    parent = out.absolute().parent
    while not (parent.exists() or parent.is_symlink()):
        parent = parent.parent
    if not parent.is_dir():
        raise UserError(f"{label}: {shown}: {parent} is not a directory")
    failed = _write_error(parent)
    if failed is not None:
        raise UserError(f"{label}: {shown}: cannot create it" +
                        (f": {failed.strerror}" if failed.strerror else f", {parent} is not writable"))


def _write_error(folder: Path) -> OSError | None:
    """Why nothing can be written in the existing directory ``folder``, or None: a bare ``PermissionError`` where
    ``os.access`` says no, else the error that stopped creating and removing a uniquely named file there (``os.access``
    answers yes to root everywhere, sysfs and read-only mounts too). Nothing else is made, so processes probing at
    once (the ranks of a launch) never remove each other's folders."""
    import tempfile

    if not os.access(folder, os.W_OK | os.X_OK):
        return PermissionError()
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".ictrl-probe-"):
            pass
    except OSError as exc:
        return exc
    return None


# --- the files ictrl wrote in an output directory ---------------------------------------------------------------

# ictrl's list of the names it writes in an output directory, kept in that directory: a file there under a name a
# command writes is replaced only when this list (or an earlier run's record, for folders written before the list
# existed) says ictrl wrote it.
OWNED_FILE = ".ictrl-files.json"
LOCK_NAME = ".ictrl.lock"  # every command's lock (ictrl.dirlock): never a file a command replaces


def owned_files(out: str | os.PathLike[str]) -> set[str] | None:
    """The names listed in ``out``'s :data:`OWNED_FILE` (None when there is none); a damaged list is one
    :class:`ictrl.errors.UserError` line naming it."""
    from ictrl.errors import UserError

    path = Path(out) / OWNED_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else str(exc).splitlines()[0][:200]
        raise UserError(f"{path}: cannot read ictrl's list of the files it wrote in {out} ({reason}); restore it "
                        "or choose another output directory") from None
    files = data.get("files") if isinstance(data, dict) else None
    if not isinstance(files, list) or not all(isinstance(name, str) for name in files):
        raise UserError(f"{path}: not ictrl's list of the files it wrote in {out} (no list of names under "
                        "'files'); restore it or choose another output directory")
    return set(files)


def claim_files(out: str | os.PathLike[str], names: Iterable[str]) -> None:
    """Add ``names`` (top-level entries of ``out``; a folder covers what is in it) to ``out``'s :data:`OWNED_FILE`,
    atomically, before they are written: a kill between the two leaves the names listed, never ictrl's files
    unlisted (which the next run would refuse to replace). Call it after :func:`check_own_files`."""
    out = Path(out)
    known = owned_files(out)
    merged = (known or set()) | set(names)
    if known is None or merged != known:
        atomic_write_json(out / OWNED_FILE, {"written_by": "ictrl", "files": sorted(merged)})


def holds_record(path: str | os.PathLike[str], keys: Iterable[str]) -> bool:
    """Whether ``path`` is a JSON object with every one of ``keys``: how an output folder an earlier ictrl wrote,
    before it listed its files there, is known by the record the command writes (run.json, results.json, ...)."""
    try:
        stored = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return False
    return isinstance(stored, dict) and set(keys) <= set(stored)


def foreign_files(out: str | os.PathLike[str], names: Iterable[str],
                  legacy: Callable[[Path], bool] | None = None) -> list[str]:
    """Of ``names`` (top-level entries of ``out``), those present that ictrl did not write there: not listed in
    :data:`OWNED_FILE`. A folder with no list whose ``legacy(out)`` is true (an earlier run's own record, written
    before the list existed) counts as ictrl's throughout."""
    out = Path(out)
    if not out.is_dir():
        return []
    owned = owned_files(out)
    if owned is None and legacy is not None and legacy(out):
        return []
    return [name for name in dict.fromkeys(names) if name not in (owned or set()) and name not in
            (OWNED_FILE, LOCK_NAME) and ((out / name).exists() or (out / name).is_symlink())]


def check_own_files(out: str | os.PathLike[str], names: Iterable[str], label: str = "--output-dir",
                    legacy: Callable[[Path], bool] | None = None, hint: str = "") -> None:
    """Refuse, in one :class:`ictrl.errors.UserError` line naming ``label`` and the file, an output directory that
    holds a file the command would replace and ictrl did not write (:func:`foreign_files`)."""
    from ictrl.errors import UserError

    found = foreign_files(out, names, legacy)
    if found:
        more = f" (and {', '.join(found[1:4])}{' ...' if len(found) > 4 else ''})" if len(found) > 1 else ""
        raise UserError(f"{label}: {Path(out) / found[0]}{more} was not written by ictrl and the command would "
                        f"replace it; choose another output directory or move the file away{hint}")


def check_output_file(path: str | os.PathLike[str], label: str,
                      legacy: Callable[[Path], bool] | None = None) -> Path:
    """A file a command writes where its user named it (``--out FILE``): its folder writable and no file there
    under its name that ictrl did not write (:func:`check_output_dir`).
    Returns it as a Path; a directory there is one line."""
    from ictrl.errors import UserError

    path = Path(path)
    if path.is_dir():
        raise UserError(f"{label}: {path} is a directory; name a file")
    check_output_dir(path.parent, label, [path.name], legacy)
    return path


def write_own(path: Path, write: Callable[[], Path]) -> Path:
    """``write()``, which writes ``path`` atomically, with ``path`` listed as ictrl's in its folder first; a write
    the filesystem refuses (read-only, full) is :func:`write_error`'s one line."""
    with reported_write(path, "nothing else was written"):
        claim_files(path.parent, [path.name])
        return write()


# --- what is never written -------------------------------------------------------------------------------------

# A key that holds a secret: transformers' TrainingArguments redacts every field ending in `_token` (hub_token) in its
# to_dict and repr; `token` is from_pretrained's (model_init_kwargs); the rest are environment credentials' names.
SECRET_KEY = re.compile(r"(?:^|_)(?:token|secret|password|passwd|api_?key|access_key)$", re.IGNORECASE)
REDACTED = "<redacted>"


def is_secret_key(name: object) -> bool:
    """Whether a config key or flag (``hub_token``, ``--hub-token``, ``model_init_kwargs.token``) holds a secret."""
    return isinstance(name, str) and SECRET_KEY.search(name.lstrip("-").replace("-", "_").split(".")[-1]) is not None


def without_secrets(data: Any) -> Any:
    """``data`` (a config mapping, nested) less every key :func:`is_secret_key` names: what a file may record."""
    if isinstance(data, dict):
        return {key: without_secrets(value) for key, value in data.items() if not is_secret_key(key)}
    if isinstance(data, list):
        return [without_secrets(item) for item in data]
    return data


def without_field_secrets(fields: dict[str, Any]) -> dict[str, Any]:
    """A config's fields (an ``ICTGRPOConfig``'s) with each secret field (``hub_token``) set to None and each
    mapping field (``model_init_kwargs``) less its secret keys."""
    return {key: None if is_secret_key(key) else without_secrets(value) if isinstance(value, dict) else value
            for key, value in fields.items()}


def redact_command(command: str) -> str:
    """The shell command line ``command`` with the value of every secret flag replaced by :data:`REDACTED`
    (``--hub_token=<redacted>``; ``--hub_token VALUE`` too): the line a model card records, and
    every command line ictrl prints (the resume line after a stop)."""
    try:
        words = shlex.split(command)
    except ValueError:  # not a line shlex.join wrote: nothing safe to keep of it
        return REDACTED
    out: list[str] = []
    hide_next = False
    for word in words:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
        elif word.startswith("-") and "=" in word and is_secret_key(word.split("=", 1)[0]):
            out.append(f"{word.split('=', 1)[0]}={REDACTED}")
        else:
            out.append(word)
            hide_next = word.startswith("--") and is_secret_key(word)
    return " ".join(word if word == REDACTED or word.endswith(f"={REDACTED}") else shlex.quote(word)
                    for word in out)
