"""``resume=auto|<path or URL>``: which checkpoint a run continues from, and how it differs from this run.

``auto`` continues only this run's own training: a checkpoint whose fingerprint
(:mod:`drivebench.ckpt.identity`) equals this run's. It looks in ``ckpt.dir`` first, then (the default
``ckpt.dir`` is inside each new run directory, so a restarted job has an empty one) in the ``checkpoints``
folders of earlier runs under ``paths.outputs_root``; the most recently written one that loads wins. A
checkpoint of other training (another gradient clipping, learning rate, seed...) is never taken: the run starts
fresh and says which checkpoints it passed over and why. ``resume=<path>`` continues any checkpoint, explicitly:
the run prints which of the training values differ.

A resumed run whose fingerprint matches keeps the checkpoint's run id (it is the same run, continued: its
pruning covers the earlier process's files too); otherwise it is a new run with an id of its own.

Lightning reads ``trainer.fit(ckpt_path=...)`` through the Trainer's checkpoint IO
(:class:`drivebench.ckpt.checkpoint_io.StorageCheckpointIO`), which opens a remote checkpoint with
the storage options of ``ckpt.dir`` when it is on the same filesystem.
"""

from __future__ import annotations

import logging
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from drivebench.ckpt.identity import RunIdentity, differences, training_values
from drivebench.ckpt.store import CheckpointFile, CheckpointStore, parse_name, step_of, store_for
from drivebench.errors import ConfigError

log = logging.getLogger(__name__)


@dataclass
class ResumePlan:
    """What ``resume`` resolved to (``path`` None: start fresh) and how the checkpoint's training differs."""

    asked: str
    path: str | None
    how: str
    theirs: RunIdentity | None = None
    differs: list[str] = field(default_factory=list)        # fingerprinted values (only for resume=<path>)
    also_differs: list[str] = field(default_factory=list)   # budget, speed knobs, dist: not part of the identity
    passed_over: list[str] = field(default_factory=list)    # resume=auto: others' checkpoints it did not take
    checkpoint: dict[str, Any] | None = field(default=None, repr=False)  # what was read (``check_model_fits``)

    @property
    def step(self) -> int | None:
        return step_of(self.path.rsplit("/", 1)[-1]) if self.path else None

    def to_summary(self) -> dict[str, Any]:
        """``summary.run.resume``."""
        return {"asked": self.asked, "from": self.path, "step": self.step, "how": self.how,
                "run_id": self.theirs.run_id if self.theirs else None, "differs": self.differs,
                "also_differs": self.also_differs, "passed_over": self.passed_over}


def _asked(cfg: Any) -> str | None:
    resume = cfg.get("resume")
    return None if resume in (None, "", "none", False) else str(resume)


def _is_remote(path: str) -> bool:
    return "://" in path and not path.startswith("file://")


def read_checkpoint(path: str, store: CheckpointStore | None = None) -> dict[str, Any]:
    """The checkpoint at ``path`` as a resume reads it (``weights_only``; locally memory-mapped, so only its
    pickle is read here); raise ConfigError naming the file when it is not a checkpoint that can be resumed."""
    try:
        if _is_remote(path):
            checkpoint = store_for(path, store).load(path)
        else:  # memory-mapped where the format allows it (torch.save's zip files): only the pickle is read
            checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(path))
    except Exception as err:  # torch raises many kinds for a file that is not a checkpoint
        raise ConfigError(f"resume={path} is not a checkpoint drivebench can read ({_why_unreadable(path, err)}); "
                          "give a step-*.ckpt file that a drivebench run wrote, or resume=auto") from None
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint or "global_step" not in checkpoint:
        raise ConfigError(f"resume={path} is not a training checkpoint (it has no state_dict and global_step); "
                          "give a step-*.ckpt file that a drivebench run wrote, or resume=auto")
    return checkpoint


# BatchNorm's counter: BatchNorm2d loads a state without it, FrozenBatchNorm2d drops it; neither fails on it
_TOLERATED = "num_batches_tracked"


def check_model_fits(mine: Mapping[str, torch.Tensor], checkpoint: Mapping[str, Any],
                     my_group_sizes: Sequence[int] | None, source: str) -> None:
    """Refuse in one line a checkpoint of another model than the one this run built (other tensors or
    shapes, or other trained parameters: a BatchNorm frozen where this run trains it) before Lightning's
    restore fails on it with a traceback. Checks only what that restore would refuse: the strict state
    load and the optimizer's group sizes (``my_group_sizes``: this run's; None when not known)."""
    theirs = checkpoint.get("state_dict") or {}
    only_there = [k for k in theirs if k not in mine and not k.endswith(_TOLERATED)]
    only_here = [k for k in mine if k not in theirs and not k.endswith(_TOLERATED)]
    shapes = [k for k in mine if k in theirs and tuple(mine[k].shape) != tuple(theirs[k].shape)]
    their_groups = [len(g.get("params", ())) for g in ((checkpoint.get("optimizer_states") or [{}])[0]
                                                        .get("param_groups") or [])]
    groups_differ = my_group_sizes is not None and bool(their_groups) and list(my_group_sizes) != their_groups
    if not (only_there or only_here or shapes or groups_differ):
        return
    details = []
    if only_there:
        details.append(f"{len(only_there)} tensors only in the checkpoint (e.g. {only_there[0]})")
    if only_here:
        details.append(f"{len(only_here)} only in this run's model (e.g. {only_here[0]})")
    if shapes:
        k = shapes[0]
        details.append(f"{len(shapes)} of other shapes (e.g. {k}: {list(theirs[k].shape)} there, {list(mine[k].shape)} here)")
    if groups_differ:
        details.append(f"its optimizer trains {their_groups} parameters per group, this run {list(my_group_sizes or [])}")
    # BatchNorm layers that train here and were frozen there (their counters are new), or the other way round
    trained_here = [k for k in mine if k.endswith(_TOLERATED) and k not in theirs]
    trained_there = [k for k in theirs if k.endswith(_TOLERATED) and k not in mine]
    hint = ""
    if trained_here and not trained_there:
        hint = (f" It froze BatchNorm that this run trains ({trained_here[0].rsplit('.', 1)[0]} and "
                f"{len(trained_here) - 1} more): model.net.norm_eval=true (+model.net.norm_eval=true where the "
                "config does not list it) continues it.")
    elif trained_there and not trained_here:
        hint = (f" It trained BatchNorm that this run freezes ({trained_there[0].rsplit('.', 1)[0]} and "
                f"{len(trained_there) - 1} more): model.net.norm_eval=with_weights continues it.")
    raise ConfigError(f"resume: {source} holds another model than this run builds ({'; '.join(details)}); resume it "
                      f"with the values it was trained with, or start a new run without resume.{hint}")


def _why_unreadable(path: str, err: BaseException) -> str:
    if not _is_remote(path):
        try:
            if Path(path).stat().st_size == 0:
                return "the file is empty"
            if not zipfile.is_zipfile(path):
                return "it is not a zip archive, which is what torch.save writes"
        except OSError:
            pass
    text = str(err).strip()
    if "Weights only load failed" in text:  # torch's advice to load it unsafely is no advice for a resume
        return "it holds objects that a safe (weights_only) load refuses"
    first = text.splitlines()[0] if text else ""
    return f"{type(err).__name__}: {first[:160]}" if first else type(err).__name__


def _identity_of(checkpoint: dict[str, Any], mine: RunIdentity) -> RunIdentity | None:
    """The identity a checkpoint carries; for one written before identities, what its config says."""
    found = RunIdentity.of_checkpoint(checkpoint)
    if found is not None:
        return found
    from drivebench.lit.base import CONFIG_KEY

    config = checkpoint.get(CONFIG_KEY)
    if isinstance(config, dict):  # the world size it ran with is not recorded: compared as this run's
        return RunIdentity(training_values(config, int(mine.values.get("world_size", 1))), run_id="unknown")
    return None


def resolve_resume(cfg: Any, store: CheckpointStore | None, identity: RunIdentity) -> ResumePlan | None:
    """Resolve ``cfg.resume`` against this run's ``identity`` (None: the run was not asked to resume). A
    checkpoint of the same training hands its run id to ``identity``. Prints (logs) what was found."""
    asked = _asked(cfg)
    if asked is None:
        return None
    plan = _explicit(asked, store, identity) if asked != "auto" else _auto(cfg, store, identity)
    if plan.path is None:
        log.warning("resume=auto: %s", plan.how)
        return plan
    if identity.same_training(plan.theirs):
        identity.run_id = plan.theirs.run_id
    log.info("resume: continuing %s (step %s; %s)", plan.path, plan.step, plan.how)
    if plan.differs:
        log.warning("resume=%s: that checkpoint trained other values, this run continues it with its own: %s",
                    asked, "; ".join(plan.differs))
    if plan.also_differs:
        log.info("resume: values that differ from that run without changing what a step computes: %s",
                 "; ".join(plan.also_differs))
    return plan


def _explicit(asked: str, store: CheckpointStore | None, identity: RunIdentity) -> ResumePlan:
    path = asked[len("file://"):] if asked.startswith("file://") else asked
    exists = store_for(path, store).exists(path) if _is_remote(path) else Path(path).is_file()
    if not exists:
        raise ConfigError(f"resume={asked} does not exist; give a checkpoint file or URL, or resume=auto")
    checkpoint = read_checkpoint(path, store)
    theirs = _identity_of(checkpoint, identity)
    plan = ResumePlan(asked, path, f"resume={asked}", theirs, checkpoint=checkpoint)
    if theirs is None:
        plan.how += " (it records no config: nothing to compare)"
        return plan
    plan.differs = differences(theirs.values, identity.values)
    plan.also_differs = differences(theirs.informative, identity.informative, limit=12) if theirs.informative else []
    if plan.differs:
        plan.how += f"; other training values: {len(plan.differs)} differ (a new run, id {identity.run_id})"
    else:
        plan.how += f"; the same training (run {theirs.run_id}, continued)"
    return plan


def _newest_first(files: list[CheckpointFile]) -> list[CheckpointFile]:
    return sorted(files, key=lambda f: (f.mtime or 0.0, f.step), reverse=True)


def _first_own(files: list[CheckpointFile], identity: RunIdentity,
               store: CheckpointStore | None = None) -> tuple[CheckpointFile, RunIdentity, dict[str, Any]] | None:
    """The newest of ``files`` that loads and whose full fingerprint is ``identity``'s, with what was read."""
    for found in _newest_first(files):
        try:
            checkpoint = (store_for(found.path, store).load(found.path) if _is_remote(found.path)
                          else _full_load(found.path))
            theirs = RunIdentity.of_checkpoint(checkpoint)
        except Exception as err:  # a file under a final name that does not load: skipped, named
            log.warning("resume=auto: skipping %s (does not load: %s)", found.path, _why_unreadable(found.path, err))
            continue
        if identity.same_training(theirs):
            return found, theirs, checkpoint
    return None


def _full_load(path: str) -> dict[str, Any]:
    """Every byte, as Lightning will read it: corruption past the pickle shows here, not mid-restore."""
    return torch.load(path, map_location="cpu", weights_only=True)


def _auto(cfg: Any, store: CheckpointStore | None, identity: RunIdentity) -> ResumePlan:
    workload = f"{cfg.model.name}/{cfg.model.size}/{cfg.data.name}" if "model" in cfg and "data" in cfg else "this model"
    in_dir = store.list_checkpoints() if store is not None else []
    own = _first_own([f for f in in_dir if f.trains_like(identity)], identity, store)
    if own is not None:
        found, theirs, checkpoint = own
        plan = ResumePlan("auto", found.path, "resume=auto: the newest checkpoint of this run's training in ckpt.dir",
                          theirs, checkpoint=checkpoint)
    else:
        root = Path(cfg.paths.outputs_root)
        earlier = []
        for path in root.glob(f"**/checkpoints/step-*-{identity.short}-*.ckpt") if root.is_dir() else []:
            parsed = parse_name(path.name)
            if parsed is not None and (store is None or not store.local or path.parent != store.path):
                try:
                    earlier.append(CheckpointFile(parsed[0], str(path), parsed[1], parsed[2], path.stat().st_mtime))
                except OSError:
                    continue
        own = _first_own(earlier, identity)
        if own is not None:
            found, theirs, checkpoint = own
            plan = ResumePlan("auto", found.path, f"resume=auto: the newest checkpoint of an earlier {workload} run "
                              "with this run's training under paths.outputs_root "
                              f"({Path(found.path).parent.parent})", theirs, checkpoint=checkpoint)
        else:
            plan = ResumePlan("auto", None, f"no checkpoint of {workload} with this run's training (fingerprint "
                              f"{identity.short}) in ckpt.dir or under paths.outputs_root; started fresh")
    others = [f for f in in_dir if not f.trains_like(identity)]
    if others:
        plan.passed_over = _passed_over(others, identity, store)
        if plan.path is None:
            plan.how += (f". ckpt.dir holds {len(others)} checkpoint(s) of other training, not continued: "
                         f"{plan.passed_over[0]}; to continue one anyway, give resume=<its path>")
    if plan.theirs is not None:
        plan.also_differs = differences(plan.theirs.informative, identity.informative, limit=12)
    return plan


def _passed_over(others: list[CheckpointFile], identity: RunIdentity, store: CheckpointStore | None) -> list[str]:
    """One line per other run in ckpt.dir (its newest file): why resume=auto did not take it."""
    newest: dict[tuple[str | None, str | None], CheckpointFile] = {}
    for f in _newest_first(others):
        newest.setdefault((f.fingerprint, f.run_id), f)
    lines = []
    for f in newest.values():
        try:
            theirs = _identity_of(_peek(f.path, store), identity)
        except Exception:  # noqa: BLE001 - unreadable: said as such
            theirs = None
        if theirs is None:
            lines.append(f"{f.path} (no run identity: written by an older drivebench, or unreadable)")
        else:
            diff = differences(theirs.values, identity.values, limit=4)
            lines.append(f"{f.path} (differs in {', '.join(diff) or 'nothing recorded'})")
    return lines


def _peek(path: str, store: CheckpointStore | None) -> dict[str, Any]:
    if _is_remote(path):
        return store_for(path, store).load(path)
    return torch.load(path, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(path))
