"""One-time preprocessing with an on-disk cache and an optional process pool.

Why: converters such as QCNet's scenario-to-graph step are pure Python and slow (upstream's runs
for hours, serially). Running them once, in parallel, and keeping one pickle per item keyed by
everything that shaped the output makes later runs start in seconds and keeps per-step loading
to a pickle read.

Layout: ``<cache_dir>/<key>/<item_name>.pkl``. Writes are atomic (temporary file + rename), so an
interrupted run leaves no half file under the final name. A damaged file is found either by the
cheap frame check in ``preprocess_all`` or by the unpickling error in ``load_cached``; both rebuild
it instead of using it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import multiprocessing
import os
import pickle
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from drivebench.accel.threads import pool_kwargs

log = logging.getLogger(__name__)

# Pickle protocol 5 files start with PROTO 5 and end with STOP.
_PICKLE_HEAD = b"\x80\x05"
_PICKLE_TAIL = b"."


@dataclass
class PreprocessStats:
    """What one ``preprocess_all`` call did: results built now, reused from disk, wall time."""

    built: int
    reused: int
    seconds: float
    workers: int


def cache_key(**parts: Any) -> str:
    """A short stable hash of everything that shapes the cached output (order-independent)."""
    text = json.dumps(parts, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def default_item_name(item: Any) -> str:
    """File stem for an item: the last path component of path-like items, else ``str(item)``."""
    if isinstance(item, (str, os.PathLike)):
        return Path(item).name
    return str(item)


def cache_path(cache_dir: Path, key: str, item_name: str) -> Path:
    return Path(cache_dir) / key / f"{item_name}.pkl"


def write_atomic(path: Path, value: Any) -> None:
    """Pickle ``value`` to ``path`` through a temporary file in the same folder, then rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            pickle.dump(value, handle, protocol=5)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def looks_complete(path: Path) -> bool:
    """Cheap check of a cache file's pickle framing (catches truncation and most garbage)."""
    try:
        size = path.stat().st_size
        if size < 3:
            return False
        with open(path, "rb") as handle:
            head = handle.read(2)
            handle.seek(-1, os.SEEK_END)
            return head == _PICKLE_HEAD and handle.read(1) == _PICKLE_TAIL
    except OSError:
        return False


def load_cached(path: Path, rebuild: Callable[[], Any] | None = None) -> Any:
    """Unpickle ``path``; if it is damaged, rebuild (and rewrite) it with ``rebuild`` or raise."""
    try:
        with open(path, "rb") as handle:
            return pickle.load(handle)
    except FileNotFoundError:
        if rebuild is None:
            raise
    except Exception as error:  # garbage bytes can raise nearly anything while unpickling
        if rebuild is None:
            raise RuntimeError(
                f"cache file {path} is damaged ({type(error).__name__}: {error}); delete it to rebuild"
            ) from error
        log.warning("cache file %s is damaged (%s: %s); rebuilding it", path, type(error).__name__, error)
    value = rebuild()
    write_atomic(path, value)
    return value


def pool_context(method: str | None = None) -> multiprocessing.context.BaseContext:
    """Start method for worker pools: ``fork`` where the OS has it (Linux), else ``spawn``.

    Why fork by default: spawned workers re-import the main module, which for a training run
    means torch, Lightning and Hydra (seconds per worker) before any work is done; PyTorch's
    DataLoader makes the same choice. Worker functions are top-level, so ``spawn`` works too
    (``DRIVEBENCH_POOL_START=spawn`` or ``method="spawn"``).
    """
    method = method or os.environ.get("DRIVEBENCH_POOL_START")
    if method is None:
        method = "fork" if "fork" in multiprocessing.get_all_start_methods() and sys.platform != "darwin" else "spawn"
    return multiprocessing.get_context(method)


def _build_one(fn: Callable[[Any], Any], item: Any, path: Path) -> None:
    """Pool task (top level so that spawn can pickle it): build one result and store it."""
    write_atomic(path, fn(item))


def _progress(iterable: Iterable[Any], total: int, desc: str, enabled: bool) -> Iterable[Any]:
    if not enabled or total == 0:
        return iterable
    from tqdm.auto import tqdm

    return tqdm(iterable, total=total, desc=desc, unit="item", dynamic_ncols=True)


def preprocess_all(
    items: Sequence[Any],
    fn: Callable[[Any], Any],
    cache_dir: Path,
    key: str,
    workers: int = 0,
    progress: bool = True,
    desc: str = "preprocess",
    name_fn: Callable[[Any], str] = default_item_name,
    mp_context: str | None = None,
) -> PreprocessStats:
    """Make sure ``fn(item)`` is cached for every item; build the missing ones.

    ``workers=0`` runs in this process; ``workers>0`` uses a process pool (``fn`` must be a
    top-level function; start method from ``pool_context``). Item names must be unique: they
    are the cache file names.
    """
    start = time.perf_counter()
    directory = Path(cache_dir) / key
    directory.mkdir(parents=True, exist_ok=True)
    paths = [cache_path(cache_dir, key, name_fn(item)) for item in items]
    if len(set(paths)) != len(paths):
        raise ValueError(f"preprocess_all({desc}): item names are not unique, so cache files would collide")
    todo = [(item, path) for item, path in zip(items, paths) if not looks_complete(path)]
    reused = len(items) - len(todo)
    if workers > 0 and len(todo) > 1:
        with ProcessPoolExecutor(max_workers=min(workers, len(todo)), mp_context=pool_context(mp_context),
                                 **pool_kwargs()) as pool:  # each process within the thread budget
            futures = [pool.submit(_build_one, fn, item, path) for item, path in todo]
            for future in _progress(as_completed(futures), len(futures), desc, progress):
                future.result()
    else:
        for item, path in _progress(todo, len(todo), desc, progress):
            _build_one(fn, item, path)
    return PreprocessStats(built=len(todo), reused=reused, seconds=time.perf_counter() - start,
                           workers=workers)
