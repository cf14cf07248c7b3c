"""A small on-disk cache for one-time preprocessing results, keyed by what they depend on.

Why here and not shared: the project's ``drivebench/data/preprocess.py`` (another contributor's)
did not exist when this package was written; this keeps the same idea (a stable hash of a key
dict, atomic writes) so switching to it later is a two-line change.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
from pathlib import Path
from typing import Any, Callable


def default_cache_dir() -> Path:
    return Path(os.environ.get("DRIVEBENCH_CACHE", Path.home() / ".cache" / "drivebench"))


def cache_key(key: dict) -> str:
    """Stable short hash of a JSON-able key dict."""
    return hashlib.sha1(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:20]


def cached(cache_dir: Path | str | None, name: str, key: dict, build: Callable[[], Any], use_cache: bool = True) -> Any:
    """Return the pickled value for ``key`` under ``cache_dir/name-<hash>.pkl``, building it once."""
    path = Path(cache_dir or default_cache_dir()) / f"{name}-{cache_key(key)}.pkl"
    if use_cache and path.exists():
        try:
            with open(path, "rb") as fh:
                stored = pickle.load(fh)
            if stored.get("key") == json.loads(json.dumps(key, sort_keys=True, default=str)):
                return stored["value"]
        except (OSError, pickle.UnpicklingError, EOFError, AttributeError, KeyError):
            pass  # unreadable or stale: rebuild
    value = build()
    if use_cache:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with open(tmp, "wb") as fh:
            pickle.dump({"key": json.loads(json.dumps(key, sort_keys=True, default=str)), "value": value}, fh,
                        protocol=pickle.HIGHEST_PROTOCOL)
        tmp.replace(path)
    return value


def file_fingerprint(paths: list[Path]) -> list[tuple[str, int, int]]:
    """(name, size, mtime_ns) of files: changes when a dataset is regenerated or edited."""
    out = []
    for p in paths:
        try:
            st = p.stat()
            out.append((p.name, st.st_size, st.st_mtime_ns))
        except OSError:
            out.append((p.name, -1, -1))
    return out
