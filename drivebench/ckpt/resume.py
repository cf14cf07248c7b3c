"""``resume=auto|<path>``: which checkpoint a run continues from.

``auto`` takes the newest complete (loadable) checkpoint in ``ckpt.dir``; when that directory is
empty (the default ``ckpt.dir`` is inside each new run directory), it looks through earlier runs
under ``paths.outputs_root`` for the newest checkpoint of a run with the same model, size and data.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import yaml

from drivebench.ckpt.store import CheckpointStore, step_of
from drivebench.errors import ConfigError

log = logging.getLogger(__name__)


def _same_workload(run_dir: Path, cfg: Any) -> bool:
    config = run_dir / ".hydra" / "config.yaml"
    try:
        data = yaml.safe_load(config.read_text())
    except (OSError, yaml.YAMLError):
        return False
    try:
        return (data["model"]["name"], data["model"]["size"], data["data"]["name"]) == (
            cfg.model.name, cfg.model.size, cfg.data.name)
    except (KeyError, TypeError):
        return False


def find_resume_checkpoint(cfg: Any, store: CheckpointStore | None) -> str | None:
    """Resolve ``cfg.resume`` to a checkpoint path/URL (None: start fresh)."""
    resume = cfg.get("resume")
    if resume in (None, "", "none", False):
        return None
    if resume != "auto":
        path = str(resume)
        if "://" not in path and not Path(path).is_file():
            raise ConfigError(f"resume={path} does not exist; give a checkpoint file, or resume=auto")
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
