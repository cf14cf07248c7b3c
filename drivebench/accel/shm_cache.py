"""Shared-memory caches: preprocessed samples (or decoded images) packed into one shared block.

Why one block: loader workers are forked from the trainer; a Python list of objects shared that
way is slowly copied page by page as reference counts change (the well-known "DataLoader memory
leak"). A single torch uint8 storage in shared memory (/dev/shm) is mapped once, never copied, and
survives pickling to spawned workers as a file-descriptor handle.

The cache is built once in the main process before the loader starts (optionally with a process
pool), sized against ``max_bytes``; if it would not fit, :class:`CacheDoesNotFit` says so and the
caller runs uncached, recording why.
"""

from __future__ import annotations

import pickle
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset
from tqdm.auto import tqdm

from drivebench.accel.threads import pool_kwargs
from drivebench.data.sampling import unpack_key


class CacheDoesNotFit(RuntimeError):
    """The cache would exceed its byte budget (accel.shm_cache_max_gb or free /dev/shm)."""


@dataclass
class CacheStats:
    kind: str
    entries: int
    bytes: int
    build_s: float
    hits: int = 0
    misses: int = 0

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        total = self.hits + self.misses
        out["hit_rate"] = self.hits / total if total else None
        return out


class SharedBlobStore:
    """Immutable byte blobs in one shared-memory tensor, addressed by integer index."""

    def __init__(self, blobs: Sequence[bytes | memoryview], max_bytes: float = float("inf")) -> None:
        sizes = np.fromiter((len(b) for b in blobs), dtype=np.int64, count=len(blobs))
        total = int(sizes.sum())
        if total > max_bytes:
            raise CacheDoesNotFit(
                f"shared-memory cache needs {total / 2**30:.2f} GiB but its budget is {max_bytes / 2**30:.2f} GiB "
                "(raise accel.shm_cache_max_gb or the size of /dev/shm, or set accel.shm_cache=false)"
            )
        self.offsets = np.zeros(len(blobs) + 1, dtype=np.int64)
        np.cumsum(sizes, out=self.offsets[1:])
        self.data = torch.empty(max(total, 1), dtype=torch.uint8).share_memory_()
        view = self.data.numpy()
        for i, blob in enumerate(blobs):
            view[self.offsets[i]:self.offsets[i + 1]] = np.frombuffer(blob, dtype=np.uint8)
        # [hits, misses], shared with the workers; increments may race, which only blurs a counter
        self.counters = torch.zeros(2, dtype=torch.int64).share_memory_()

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def nbytes(self) -> int:
        return int(self.offsets[-1])

    def get(self, index: int) -> memoryview:
        self.counters[0] += 1
        lo, hi = self.offsets[index], self.offsets[index + 1]
        return memoryview(self.data.numpy()[lo:hi])


def _serialize(obj: Any) -> bytes:
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


class SharedSampleCache(Dataset):
    """Serve a dataset's raw (pre-transform) samples from shared memory.

    The wrapped dataset must offer ``load_raw(i)`` (the expensive part: file read + decode of a
    preprocessed sample) and an optional ``transform`` applied per access (the model's per-sample
    work, which may be random and so is not cached).
    """

    def __init__(self, dataset: Any, max_bytes: float, progress: bool = True, desc: str = "shm cache") -> None:
        if not hasattr(dataset, "load_raw"):
            raise TypeError(f"{type(dataset).__name__} has no load_raw(i); it cannot be cached in shared memory")
        t0 = time.perf_counter()
        n = len(dataset)
        blobs = []
        total = 0
        for i in tqdm(range(n), desc=desc, disable=not progress, leave=False):
            blob = _serialize(dataset.load_raw(i))
            total += len(blob)
            if total > max_bytes:
                raise CacheDoesNotFit(
                    f"shared-memory cache needs more than {max_bytes / 2**30:.2f} GiB for {n} samples "
                    "(raise accel.shm_cache_max_gb or the size of /dev/shm, or set accel.shm_cache=false)"
                )
            blobs.append(blob)
        self.store = SharedBlobStore(blobs, max_bytes)
        self.dataset = dataset
        self.transform: Callable[[Any], Any] | None = getattr(dataset, "transform", None)
        self._build_s = time.perf_counter() - t0

    def __len__(self) -> int:
        return len(self.store)

    def load_raw(self, index: int) -> Any:
        return pickle.loads(self.store.get(index))

    accepts_sample_keys = True

    def __getitem__(self, item: Any) -> Any:
        raw = self.load_raw(unpack_key(item)[0])  # the transforms it wraps (QCNet's) draw no randomness
        return self.transform(raw) if self.transform is not None else raw

    def __getattr__(self, name: str) -> Any:
        # everything else (set_epoch, metadata, sequence ids...) comes from the wrapped dataset
        if name in ("dataset", "store", "transform", "_build_s"):
            raise AttributeError(name)
        return getattr(self.dataset, name)

    def stats(self) -> CacheStats:
        hits, misses = (int(v) for v in self.store.counters)
        return CacheStats("samples", len(self.store), self.store.nbytes, self._build_s, hits, misses)


class SharedArrayCache:
    """Read-only numpy arrays (e.g. decoded camera images) keyed by string, in shared memory.

    ``get(key)`` returns a zero-copy, read-only view, or None for a key that was not cached (a
    miss, counted), so a loader can fall back to decoding the file itself.
    """

    def __init__(self, keys: Sequence[str], load: Callable[[str], np.ndarray | None], max_bytes: float, workers: int = 0,
                 progress: bool = True, desc: str = "shm image cache") -> None:
        t0 = time.perf_counter()
        self.keys = tuple(keys)  # what was asked for (a build of the same files can share this cache)
        arrays: list[np.ndarray] = []
        kept: list[str] = []
        total = 0
        for key, arr in zip(keys, _map(load, keys, workers, progress, desc)):
            if arr is None:  # ``load`` could not read it: left out, so a get() is a miss (the caller reads it)
                continue
            kept.append(key)
            arr = np.ascontiguousarray(arr)
            total += arr.nbytes
            if total > max_bytes:
                raise CacheDoesNotFit(
                    f"shared-memory image cache needs more than {max_bytes / 2**30:.2f} GiB for {len(keys)} images "
                    "(raise accel.shm_cache_max_gb or the size of /dev/shm, or set accel.shm_cache=false)"
                )
            arrays.append(arr)
        self.index = {k: i for i, k in enumerate(kept)}
        self.left_out = len(keys) - len(kept)
        self.meta = [(a.dtype.str, a.shape) for a in arrays]
        self.store = SharedBlobStore([a.reshape(-1).view(np.uint8).data for a in arrays], max_bytes)
        self._build_s = time.perf_counter() - t0

    def get(self, key: str) -> np.ndarray | None:
        i = self.index.get(key)
        if i is None:
            self.store.counters[1] += 1
            return None
        dtype, shape = self.meta[i]
        arr = np.frombuffer(self.store.get(i), dtype=np.dtype(dtype)).reshape(shape)
        arr.flags.writeable = False
        return arr

    def stats(self) -> CacheStats:
        hits, misses = (int(v) for v in self.store.counters)
        return CacheStats("images", len(self.store), self.store.nbytes, self._build_s, hits, misses)


def _map(fn: Callable[[str], np.ndarray], keys: Sequence[str], workers: int, progress: bool,
         desc: str) -> Iterable[np.ndarray]:
    if workers > 0:
        with ProcessPoolExecutor(max_workers=workers, **pool_kwargs()) as pool:
            yield from tqdm(pool.map(fn, keys, chunksize=8), total=len(keys), desc=desc, disable=not progress,
                            leave=False)
    else:
        yield from tqdm(map(fn, keys), total=len(keys), desc=desc, disable=not progress, leave=False)
