"""One exclusive file lock for every "only one process does this at a time" in drivebench.

Why: generating an embedded dataset, preparing a cache or building the mmcv wheel must not run twice
at once when several processes start together (DDP ranks, parallel test sessions, two shells);
a POSIX advisory lock on a file next to the work serialises them, and the second finds the work done.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator

try:
    import fcntl
except ImportError:  # Windows: no flock; runs there are single-process anyway
    fcntl = None  # type: ignore[assignment]


@contextlib.contextmanager
def exclusive_lock(path: Path | str) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created with its parent folders) for the ``with`` block."""
    if fcntl is None:
        yield
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
