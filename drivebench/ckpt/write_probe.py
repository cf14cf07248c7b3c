"""A timed write of a checkpoint-sized probe file where checkpoints go, then its removal.

Why one probe: the doctor (``storage.ckpt_dir`` / ``storage.ckpt_write``, the cache directories)
and ``bench=storage`` both ask "how long does a synchronous save block here?". Both write the way
:class:`~drivebench.ckpt.store.CheckpointStore` saves: a local directory gets write, flush and
fsync (open to close is the time a save blocks the step); an fsspec URL gets one ``pipe`` (one PUT
on object stores). The bytes are random, so compression or deduplication cannot shorten the write.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the doctor imports this module and must not need torch to (store.py imports it)
    from drivebench.ckpt.store import CheckpointStore

CHUNK = 8 * 2**20  # a local probe writes one random chunk of this size over and over (bounded memory)


@dataclass
class WriteStats:
    nbytes: int
    seconds: float           # open to close, fsync included (remote: the pipe call)
    fsync_s: float           # the fsync alone (0.0 for a remote store)

    @property
    def mb_per_s(self) -> float:
        return self.nbytes / self.seconds / 1e6 if self.seconds > 0 else float("inf")


def probe_name(tag: str = "probe") -> str:
    """A hidden file name no checkpoint and no other process uses."""
    return f".drivebench-{tag}-{os.getpid()}-{time.monotonic_ns()}.tmp"


def _remote_path(store: CheckpointStore, name: str) -> str:
    return f"{str(store._root).rstrip('/')}/{name}"


def timed_write(store: CheckpointStore, name: str, nbytes: int) -> WriteStats:
    """Write ``nbytes`` random bytes to ``name`` in ``store`` as a checkpoint save would, timed."""
    if store.local:
        assert store.path is not None
        chunk = os.urandom(min(CHUNK, max(nbytes, 1)))
        started = time.perf_counter()
        with open(store.path / name, "wb") as handle:
            left = nbytes
            while left > 0:
                left -= handle.write(chunk[: min(left, len(chunk))])
            handle.flush()
            synced = time.perf_counter()
            os.fsync(handle.fileno())
            fsync_s = time.perf_counter() - synced
        return WriteStats(nbytes, time.perf_counter() - started, fsync_s)
    payload = os.urandom(nbytes)
    started = time.perf_counter()
    store._fs.pipe(_remote_path(store, name), payload)
    return WriteStats(nbytes, time.perf_counter() - started, 0.0)


def timed_read(store: CheckpointStore, name: str) -> float:
    """Seconds to read ``name`` back whole (locally in 64 MiB blocks; remotely one ``cat_file``)."""
    started = time.perf_counter()
    if store.local:
        assert store.path is not None
        with open(store.path / name, "rb") as handle:
            while handle.read(64 * 2**20):
                pass
    else:
        store._fs.cat_file(_remote_path(store, name))
    return time.perf_counter() - started


def remove(store: CheckpointStore, name: str) -> None:
    """Delete a probe; best effort (one left behind is a hidden dot-file)."""
    try:
        if store.local:
            assert store.path is not None
            (store.path / name).unlink(missing_ok=True)
        else:
            store._fs.rm(_remote_path(store, name))
    except Exception:  # already gone, or the backend cannot delete: nothing else to do
        pass


def write_probe(store: CheckpointStore, nbytes: int, tag: str = "probe") -> WriteStats:
    """One timed write of ``nbytes`` into ``store``; the probe is removed whatever happens."""
    name = probe_name(tag)
    try:
        return timed_write(store, name, nbytes)
    finally:
        remove(store, name)


__all__ = ["WriteStats", "probe_name", "remove", "timed_read", "timed_write", "write_probe"]
