"""One writer per output directory: :class:`OutputLock`, ``filelock``'s ``flock`` on ``OUT/.ictrl.lock``.

The lock file names its holder (``pid N on HOST``). The kernel drops a flock when the process holding it ends,
however it ends, so a lock left by a killed process is free: the next one takes it and says whose it was. A second
writer finds it held and stops with one line naming the holder's pid. A flock excludes every other open of the
file, in the same process too.
"""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path
from types import TracebackType

from filelock import FileLock, Timeout

from ictrl.errors import ConfigError
from ictrl.files import LOCK_NAME, is_write_failure, write_error


class OutputLock:
    """Exclusive lock of the directory ``out`` (``with OutputLock(out):``), created if missing.

    ``label`` starts every error line (the option or field that named ``out``), ``user`` says what holds it
    ("another run"), ``stopped`` ends a write failure's line ("the run did not start"). :meth:`acquire` raises
    :class:`ictrl.errors.ConfigError` ``"{label}: {out} is in use by {user} (pid N on HOST, lock PATH); wait for it
    to end or stop it"`` when another process (or another ``OutputLock`` in this one) holds it, and
    :class:`ictrl.errors.WriteError` when the lock file cannot be written. A directory that :meth:`acquire` created
    and that holds nothing but the lock at :meth:`release` is removed.
    """

    def __init__(self, out: str | os.PathLike[str], *, label: str = "output_dir", user: str = "another run",
                 stopped: str = "the run did not start", logger: str = "ictrl.train") -> None:
        self.out = Path(out)
        self.path = self.out / LOCK_NAME
        self.label, self.user, self.stopped = label, user, stopped
        self._log = logging.getLogger(logger)
        self._lock = FileLock(self.path, timeout=0)
        self._created = False

    @property
    def held(self) -> bool:
        return self._lock.is_locked

    def holder(self) -> str:
        """What the lock file says of its holder (``pid N on HOST``), or "" when it names none."""
        try:
            return self.path.read_text(encoding="utf-8", errors="replace").strip()[:200]
        except OSError:
            return ""

    def acquire(self) -> None:
        """Take the lock and write this process into it, or raise (see the class)."""
        self._created = not self.out.exists()
        try:
            self.out.mkdir(parents=True, exist_ok=True)
            self._lock.acquire()
        except Timeout:
            raise ConfigError(f"{self.label}: {self.out} is in use by {self.user} ({self.holder() or 'pid unknown'}, "
                              f"lock {self.path}); wait for it to end or stop it") from None
        except OSError as exc:
            if is_write_failure(exc):
                raise write_error(self.path, exc, self.stopped) from None
            raise ConfigError(f"{self.label}: cannot lock {self.path}: {exc.strerror or exc}") from None
        left = self.holder()
        if left:  # a holder that ended without releasing: killed
            self._log.warning("%s: taking over the lock of %s, which is no longer running", self.label, left)
        try:
            self._write(f"pid {os.getpid()} on {socket.gethostname()}\n")
        except OSError as exc:
            self._lock.release()
            raise write_error(self.path, exc, self.stopped) from None

    def release(self) -> None:
        if not self._lock.is_locked:
            return
        try:
            self._write("")  # an empty file: released in order, nothing to report to the next holder
            if self._created and [p.name for p in self.out.iterdir()] == [LOCK_NAME]:
                self.path.unlink()  # stopped before writing anything: leave no directory behind
                self.out.rmdir()
        finally:
            self._lock.release()

    def _write(self, text: str) -> None:
        # Through a descriptor of its own: a flock belongs to filelock's open of the file, which this leaves alone.
        fd = os.open(self.path, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.ftruncate(fd, 0)
            if text:
                os.pwrite(fd, text.encode(), 0)
        finally:
            os.close(fd)

    def __enter__(self) -> OutputLock:
        self.acquire()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.release()
