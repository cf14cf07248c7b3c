"""``resume=auto|<path or URL>``: which checkpoint a run continues from, and a copy Lightning can read.

``auto`` takes the newest complete (loadable) checkpoint in ``ckpt.dir``; when that directory is
empty (the default ``ckpt.dir`` is inside each new run directory), it looks through earlier runs
under ``paths.outputs_root`` for the newest checkpoint of a run with the same model, size and data.

Lightning opens ``trainer.fit(ckpt_path=...)`` through fsspec without our storage options, so a
remote checkpoint is first copied to a local temporary file with the options of ``ckpt.dir``
(:func:`readable_checkpoint`).
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator

import yaml

from drivebench.ckpt.store import CheckpointStore, step_of
from drivebench.errors import ConfigError
from drivebench.models.registry import get_spec

log = logging.getLogger(__name__)


def _same_workload(run_dir: Path, cfg: Any) -> bool:
    config = run_dir / ".hydra" / "config.yaml"
    try:
        data = yaml.safe_load(config.read_text())
    except (OSError, yaml.YAMLError):
        return False
    try:
        name, size = data["model"]["name"], data["model"]["size"]
        return (name, _current_size(name, size), data["data"]["name"]) == (cfg.model.name, cfg.model.size,
                                                                           cfg.data.name)
    except (KeyError, TypeError):
        return False


def _current_size(model: str, size: Any) -> Any:
    """A size name as runs write it now: an earlier run may have used a deprecated name (QCNet ``tiny``)."""
    try:
        return get_spec(model).deprecated_sizes.get(size, size)
    except (ValueError, TypeError):  # a model this version does not know: compare as written
        return size


def _is_remote(path: str) -> bool:
    return "://" in path and not path.startswith("file://")


def _store_for(path: str, store: CheckpointStore | None) -> CheckpointStore:
    """A store for the directory of ``path``, with ``store``'s options when it is the same filesystem."""
    parent = path.rsplit("/", 1)[0]
    options = store._options if store is not None and store.same_filesystem(path) else None
    return CheckpointStore(parent, options)


def find_resume_checkpoint(cfg: Any, store: CheckpointStore | None) -> str | None:
    """Resolve ``cfg.resume`` to a checkpoint path/URL (None: start fresh)."""
    resume = cfg.get("resume")
    if resume in (None, "", "none", False):
        return None
    if resume != "auto":
        path = str(resume)
        if path.startswith("file://"):
            path = path[len("file://"):]
        exists = _store_for(path, store).exists(path) if _is_remote(path) else Path(path).is_file()
        if not exists:
            raise ConfigError(f"resume={resume} does not exist; give a checkpoint file or URL, or resume=auto")
        return path
    if store is not None:
        latest = store.latest_complete()
        if latest is not None:
            return latest
    root = Path(cfg.paths.outputs_root)
    candidates = []
    for ckpt in root.glob("**/checkpoints/step-*.ckpt") if root.is_dir() else []:
        run_dir = ckpt.parent.parent
        if _same_workload(run_dir, cfg):
            candidates.append((ckpt.stat().st_mtime, step_of(ckpt.name) or 0, ckpt))
    for _, _, ckpt in sorted(candidates, reverse=True):
        if CheckpointStore(str(ckpt.parent)).loadable(str(ckpt)):
            return str(ckpt)
        log.warning("resume=auto: skipping %s (does not load)", ckpt)
    log.warning("resume=auto: no checkpoint of %s/%s/%s found; starting fresh", cfg.model.name, cfg.model.size,
                cfg.data.name)
    return None


@contextlib.contextmanager
def readable_checkpoint(path: str | None, store: CheckpointStore | None) -> Iterator[str | None]:
    """Yield a path ``trainer.fit(ckpt_path=...)`` can open: local paths as they are, remote ones
    copied (with ``ckpt.storage_options``) to a temporary file that is removed afterwards."""
    if path is None or not _is_remote(path):
        yield path
        return
    scratch = Path(tempfile.mkdtemp(prefix="drivebench-resume-"))
    try:
        yield str(_store_for(path, store).download(path, scratch / path.rsplit("/", 1)[-1]))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
