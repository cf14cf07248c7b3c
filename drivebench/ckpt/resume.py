"""``resume=auto|<path or URL>``: which checkpoint a run continues from.

``auto`` takes the newest complete (loadable) checkpoint in ``ckpt.dir``; when that directory is
empty (the default ``ckpt.dir`` is inside each new run directory), it looks through earlier runs
under ``paths.outputs_root`` for the newest checkpoint of a run with the same model, size and data.
Those are compared as the earlier run resolved them: its saved ``.hydra/config.yaml`` holds the
default size as written (``size: ${on_gpu:paper,test}``), so the resolved values come from the
config each checkpoint carries (``drivebench_config``), else from the run's ``summary.json``.

Lightning reads ``trainer.fit(ckpt_path=...)`` through the Trainer's checkpoint IO
(:class:`drivebench.ckpt.checkpoint_io.StorageCheckpointIO`), which opens a remote checkpoint with
the storage options of ``ckpt.dir`` when it is on the same filesystem.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch
import yaml

from drivebench.ckpt.store import CheckpointStore, step_of, store_for
from drivebench.errors import ConfigError
from drivebench.models.registry import get_spec

log = logging.getLogger(__name__)


Workload = tuple[str, Any, str]  # (model name, model size, data name), as resolved


def _literal(value: Any) -> bool:
    return not (isinstance(value, str) and "${" in value)


def _recorded_workload(run_dir: Path, ckpt: Path) -> Workload | None:
    """What an earlier run trained, on resolved values (None: nothing readable says)."""
    from drivebench.lit.base import CONFIG_KEY

    try:
        data = yaml.safe_load((run_dir / ".hydra" / "config.yaml").read_text())
        written = (data["model"]["name"], data["model"]["size"], data["data"]["name"])
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        written = None
    if written is not None and all(_literal(v) for v in written):
        return written
    try:  # the resolved config the checkpoint carries; mmap: the pickle only, no tensor data read
        config = torch.load(ckpt, map_location="cpu", weights_only=True, mmap=True).get(CONFIG_KEY) or {}
        return config["model"]["name"], config["model"]["size"], config["data"]["name"]
    except Exception:  # an older checkpoint without the config, or one that does not load (skipped later)
        pass
    try:
        run = json.loads((run_dir / "summary.json").read_text())["run"]
        return run["model"], run["model_size"], run["data"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _same_workload(run_dir: Path, ckpt: Path, cfg: Any) -> bool:
    found = _recorded_workload(run_dir, ckpt)
    if found is None:
        return False
    name, size, data = found
    return (name, _current_size(name, size), data) == (cfg.model.name, cfg.model.size, cfg.data.name)


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
        if _same_workload(ckpt.parent.parent, ckpt, cfg):
            candidates.append((ckpt.stat().st_mtime, step_of(ckpt.name) or 0, ckpt))
    for _, _, ckpt in sorted(candidates, reverse=True):
        if CheckpointStore(str(ckpt.parent)).loadable(str(ckpt)):
            return str(ckpt)
        log.warning("resume=auto: skipping %s (does not load)", ckpt)
    log.warning("resume=auto: no checkpoint of %s/%s/%s found; starting fresh", cfg.model.name, cfg.model.size,
                cfg.data.name)
    return None


def describe_resume(cfg: Any, path: str | None, store: CheckpointStore | None) -> dict[str, Any] | None:
    """``summary.run.resume``: what was asked, the checkpoint and its step, and how it was found
    (None: the run was not asked to resume)."""
    asked = cfg.get("resume")
    if asked in (None, "", "none", False):
        return None
    workload = f"{cfg.model.name}/{cfg.model.size}/{cfg.data.name}"
    if path is None:
        how = f"resume=auto: no checkpoint of {workload} in ckpt.dir or under paths.outputs_root; started fresh"
    elif asked != "auto":
        how = f"resume={asked}"
    elif store is not None and path in {found for _, found in store.list_steps()}:
        how = "resume=auto: the newest complete checkpoint in ckpt.dir"
    else:
        how = (f"resume=auto: the newest checkpoint of an earlier {workload} run under paths.outputs_root "
               f"({Path(path).parent.parent})")
    return {"asked": str(asked), "from": path, "step": step_of(path.rsplit("/", 1)[-1]) if path else None, "how": how}
