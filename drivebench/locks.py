"""One exclusive file lock for every "only one process does this at a time" in drivebench.

Why: generating an embedded dataset, preparing a cache or building the mmcv wheel must not run twice
at once when several processes start together (DDP ranks, parallel test sessions, two shells);
a POSIX advisory lock on a file next to the work serialises them, and the second finds the work done.
The same lock, taken without waiting and held for a run's lifetime (:func:`hold_lock`), keeps a second
live run out of a checkpoint directory: the second is told who holds it instead of waiting.
"""

from __future__ import annotations

import contextlib
import errno
import logging
from pathlib import Path
from typing import IO, Iterator

try:
    import fcntl
except ImportError:  # Windows: no flock; runs there are single-process anyway
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)


@contextlib.contextmanager
def exclusive_lock(path: Path | str) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created with its parent folders) for the ``with`` block; where
    this process cannot create it (a read-only filesystem, no write permission), the block runs unlocked."""
    if fcntl is None:
        yield
        return
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(path, "a")
    except OSError as err:
        if err.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
            raise
        # a directory this process cannot write (a read-only cache, another user's): it can only read the
        # work there, which needs no lock; writing it would fail with its own error, naming the file
        log.debug("no lock at %s (%s): this process can only read there", path, err.strerror)
        yield
        return
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class LockBusy(RuntimeError):
    """Another process holds the lock; ``holder`` is what it wrote into the lock file (may be empty)."""

    def __init__(self, path: Path, holder: str) -> None:
        super().__init__(f"{path} is held by {holder or 'another process'}")
        self.path = path
        self.holder = holder


class HeldLock:
    """An exclusive lock held until :meth:`release` (or until the process ends: the kernel drops it)."""

    def __init__(self, path: Path, handle: IO[str]) -> None:
        self.path = path
        self._handle: IO[str] | None = handle

    def release(self) -> None:
        if self._handle is None:
            return
        handle, self._handle = self._handle, None
        try:
            handle.seek(0)
            handle.truncate()  # no stale holder text for the next reader
        except OSError:
            pass
        if fcntl is not None:
            fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()


def hold_lock(path: Path | str, holder: str = "") -> HeldLock:
    """Take the exclusive lock on ``path`` now, without waiting, and write ``holder`` (who took it) into the
    file for whoever finds it taken; raise :class:`LockBusy` (naming the holder) if another process has it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = open(path, "a+")
    if fcntl is not None:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            text = handle.read().strip()
            handle.close()
            raise LockBusy(path, text) from None
    handle.seek(0)
    handle.truncate()
    handle.write(holder + "\n")
    handle.flush()
    return HeldLock(path, handle)
