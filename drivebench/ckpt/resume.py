"""``resume=auto|<path or URL>``: which checkpoint a run continues from.

``auto`` takes the newest complete (loadable) checkpoint in ``ckpt.dir``; when that directory is
empty (the default ``ckpt.dir`` is inside each new run directory), it looks through earlier runs
under ``paths.outputs_root`` for the newest checkpoint of a run with the same model, size and data.

Lightning reads ``trainer.fit(ckpt_path=...)`` through the Trainer's checkpoint IO
(:class:`drivebench.ckpt.checkpoint_io.StorageCheckpointIO`), which opens a remote checkpoint with
the storage options of ``ckpt.dir`` when it is on the same filesystem.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import yaml

from drivebench.ckpt.store import CheckpointStore, step_of, store_for
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


def find_resume_checkpoint(cfg: Any, store: CheckpointStore | None) -> str | None:
    """Resolve ``cfg.resume`` to a checkpoint path/URL (None: start fresh)."""
    resume = cfg.get("resume")
    if resume in (None, "", "none", False):
        return None
    if resume != "auto":
        path = str(resume)
        if path.startswith("file://"):
            path = path[len("file://"):]
        exists = store_for(path, store).exists(path) if _is_remote(path) else Path(path).is_file()
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
