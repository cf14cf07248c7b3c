"""Which run a checkpoint belongs to: a fingerprint of what it trains, and a run id.

Why: a checkpoint directory may be shared (a fixed ``ckpt.dir`` in a machine profile, a restarted job), and
the step number alone said nothing about who wrote a file: pruning deleted other runs' checkpoints, a
fresh run overwrote them, and ``resume=auto`` continued whatever had the highest step.

* The **fingerprint** hashes every resolved value that changes what a training step computes: the whole
  ``model`` group (architecture, size, batch size, optimizer, scheduler, transforms; ``val_batch_size`` is
  left out), the whole ``data`` group (but where its preprocessing cache lives), ``seed``,
  ``trainer.gradient_clip_val`` / ``gradient_clip_algorithm`` / ``accumulate_grad_batches``,
  ``accel.precision`` and the number of training processes (the global batch). Left out on purpose:
  the step budget (``trainer.max_steps``, ``max_epochs``, ``bench.*``), so that a run can be continued
  for longer (a schedule computed from the budget, such as QCNet's convergence ``T_max``, is a model
  value and so is in), and the speed knobs of ``accel`` that at most change rounding (they are listed in
  the summary's ``settings.numerics_changed_by``, and printed as differences on a resume).
* The **run id** tells two runs of the same config apart; a run resumed from a checkpoint of the same
  fingerprint keeps that checkpoint's run id: it is the same run, continued.

Both are in every checkpoint's file name (``step-<step>-<fingerprint[:8]>-<run id>.ckpt``, so listing and
pruning read no file) and, with the fingerprinted values, in the checkpoint itself (``drivebench_run``), so a
resume can say which keys differ.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

IDENTITY_KEY = "drivebench_run"  # the checkpoint entry holding the identity (plain data, weights_only-safe)
SHORT = 8  # hex digits of the fingerprint in a file name

# (group or key, keys under it that are not part of the identity)
_FINGERPRINTED: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("model", ("val_batch_size",)),
    ("data", ("source.cache_dir",)),
    ("seed", ()),
    ("trainer.gradient_clip_val", ()),
    ("trainer.gradient_clip_algorithm", ()),
    ("trainer.accumulate_grad_batches", ()),
    ("accel.precision", ()),
)
# compared on a resume and printed when they differ, but not part of the identity
_INFORMATIVE = ("trainer", "bench", "accel", "dist", "ckpt")
_NEVER_COMPARED = ("ckpt.storage_options", "ckpt.dir", "ckpt.io", "ckpt.callback", "ckpt.name", "bench._target_")


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (lists stay values)."""
    if not isinstance(tree, Mapping):
        return {prefix: tree} if prefix else {}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, path))
        else:
            out[path] = value
    return out


def _select(flat: dict[str, Any], root: str, excluded: Iterable[str]) -> dict[str, Any]:
    skip = tuple(f"{root}.{e}" for e in excluded)
    return {k: v for k, v in flat.items()
            if (k == root or k.startswith(root + ".")) and not any(k == s or k.startswith(s + ".") for s in skip)}


def training_values(config: Mapping[str, Any], world_size: int) -> dict[str, Any]:
    """The fingerprinted values of a resolved config (plain data, e.g. ``OmegaConf.to_container(cfg, resolve=True)``)."""
    flat = flatten(config)
    values: dict[str, Any] = {}
    for root, excluded in _FINGERPRINTED:
        values.update(_select(flat, root, excluded))
    for key in ("trainer.gradient_clip_val", "trainer.gradient_clip_algorithm", "trainer.accumulate_grad_batches"):
        values.setdefault(key, None)  # absent and null are the same value
    values["world_size"] = int(world_size)
    return values


def informative_values(config: Mapping[str, Any]) -> dict[str, Any]:
    """Values a resume reports when they differ without changing the identity (budget, speed knobs, dist)."""
    flat = flatten(config)
    out: dict[str, Any] = {}
    for root in _INFORMATIVE:
        out.update(_select(flat, root, ()))
    return {k: v for k, v in out.items() if not any(k == n or k.startswith(n + ".") for n in _NEVER_COMPARED)}


def fingerprint(values: Mapping[str, Any]) -> str:
    text = json.dumps({k: values[k] for k in sorted(values)}, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def new_run_id() -> str:
    return uuid.uuid4().hex[:8]


@dataclass
class RunIdentity:
    """What a run trains (``values``, hashed into ``fingerprint``) and which run it is (``run_id``)."""

    values: dict[str, Any]
    run_id: str = field(default_factory=new_run_id)
    informative: dict[str, Any] = field(default_factory=dict)
    fingerprint: str = ""

    def __post_init__(self) -> None:
        if not self.fingerprint:
            self.fingerprint = fingerprint(self.values)

    @classmethod
    def of_config(cls, config: Mapping[str, Any], world_size: int, run_id: str | None = None) -> "RunIdentity":
        return cls(training_values(config, world_size), run_id or new_run_id(), informative_values(config))

    @property
    def short(self) -> str:
        return self.fingerprint[:SHORT]

    def to_dict(self) -> dict[str, Any]:
        return {"fingerprint": self.fingerprint, "run_id": self.run_id, "values": dict(self.values),
                "informative": dict(self.informative)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "RunIdentity":
        return cls(dict(data.get("values") or {}), str(data["run_id"]), dict(data.get("informative") or {}),
                   str(data["fingerprint"]))

    @classmethod
    def of_checkpoint(cls, checkpoint: Mapping[str, Any]) -> "RunIdentity | None":
        """The identity a checkpoint carries (None: written before checkpoints had one)."""
        data = checkpoint.get(IDENTITY_KEY)
        if isinstance(data, Mapping) and data.get("fingerprint") and data.get("run_id"):
            return cls.from_dict(data)
        return None

    def same_training(self, other: "RunIdentity | None") -> bool:
        return other is not None and other.fingerprint == self.fingerprint


def differences(theirs: Mapping[str, Any], mine: Mapping[str, Any], limit: int | None = None) -> list[str]:
    """``key: theirs -> mine`` for every key whose value differs (a key only one side has shows ``(absent)``)."""
    lines = []
    for key in sorted(set(theirs) | set(mine)):
        a, b = theirs.get(key, "(absent)"), mine.get(key, "(absent)")
        if a != b:
            lines.append(f"{key}: {_short(a)} -> {_short(b)}")
    if limit is not None and len(lines) > limit:
        lines = lines[:limit] + [f"... and {len(lines) - limit} more"]
    return lines


def _short(value: Any) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else value
    return text if len(text) <= 60 else text[:57] + "..."
