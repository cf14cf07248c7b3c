"""The run the doctor checks for: the composed config, this machine, the resolved accel preset,
and the places (checkpoint dir, dataset root, caches) that run would use.

The config is composed with Hydra's compose API from the packaged ``drivebench/conf`` with the same
overrides a training run takes, so ``python -m drivebench.doctor ckpt.dir=/mnt/x`` checks /mnt/x.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from omegaconf import DictConfig, ListConfig, OmegaConf

import drivebench
from drivebench.accel.settings import AccelSettings
from drivebench.doctor.probe import MadeDirs, error_text
from drivebench.errors import ConfigError
from drivebench.perf.machine import MachineInfo, detect_machine

FALLBACK_CHECKPOINT_BYTES = 256 * 2**20
CHECKPOINT_FACTOR = 3  # weights + two Adam moments: a checkpoint is about 3x the parameter bytes


def compose_config(overrides: list[str]) -> DictConfig:
    """The packaged ``drivebench/conf/config.yaml`` with ``overrides``, as a run composes it; any Hydra
    error becomes one ConfigError line (the same line a training run prints)."""
    from drivebench.compose import compose

    return compose(list(overrides))


@dataclass
class CkptTarget:
    """Where checkpoints go: a local directory (``path``) or an fsspec URL (``path`` is None)."""

    location: str
    path: Path | None
    storage_options: dict[str, Any] = field(default_factory=dict, repr=False)  # credentials: never printed

    @property
    def remote(self) -> bool:
        return self.path is None


@dataclass
class DataLocation:
    """Where the configured dataset lives and where its preprocessing cache goes."""

    root: Path | None
    embedded: bool
    cache_dir: Path | None
    error: str | None = None


@dataclass
class DoctorContext:
    """Everything the checks read; built once, before any check runs."""

    cfg: DictConfig
    overrides: list[str]
    machine: MachineInfo
    accel: AccelSettings
    skip_slow: bool = False
    output_stand_in: Path | None = None  # replaces the Hydra run dir, which exists only inside a run
    notes: list[str] = field(default_factory=list)
    made: MadeDirs = field(default_factory=MadeDirs)
    memo: dict[str, Any] = field(default_factory=dict)

    def select(self, key: str, default: Any = None) -> Any:
        """A config value, or ``default`` when the key is absent or cannot be resolved."""
        try:
            value = OmegaConf.select(self.cfg, key, default=default)
        except Exception:  # an interpolation that only resolves inside a real run
            return default
        return OmegaConf.to_container(value, resolve=True) if isinstance(value, (DictConfig, ListConfig)) else value

    @property
    def cache_root(self) -> Path:
        """``paths.cache``: embedded datasets, preprocessing caches and the doctor's own cache."""
        return Path(str(self.select("paths.cache", Path.home() / ".cache" / "drivebench"))).expanduser()

    def ckpt_target(self) -> tuple["CkptTarget | None", str | None]:
        """``(where checkpoints go, error)``; ``(None, None)`` when the run writes no checkpoints."""
        ckpt = self.cfg.get("ckpt")
        if ckpt is not None and "dir" in ckpt and OmegaConf.is_missing(ckpt, "dir"):
            return None, f"ckpt={ckpt.get('name')} needs a location: set ckpt.dir=<path or URL>"
        try:
            value = OmegaConf.select(self.cfg, "ckpt.dir")
        except Exception as err:
            return None, f"ckpt.dir cannot be resolved outside a run ({error_text(err)})"
        if value in (None, ""):
            return None, None
        options = self.select("ckpt.storage_options", {}) or {}
        parsed = urlparse(str(value))
        if len(parsed.scheme) > 1 and parsed.scheme != "file":  # "C:\" is a drive, not a scheme
            return CkptTarget(str(value), None, options), None
        local = Path(parsed.path if parsed.scheme == "file" else str(value)).expanduser().absolute()
        return CkptTarget(str(value), local, options), None

    def data_location(self) -> DataLocation:
        """The dataset root as the configured data source derives it (``data.root`` or the embedded set)."""
        if "data_location" not in self.memo:
            self.memo["data_location"] = self._locate_data()
        return self.memo["data_location"]

    def _locate_data(self) -> DataLocation:
        from hydra.utils import instantiate

        cache = self.select("data.source.cache_dir")
        cache_dir = Path(str(cache)).expanduser() if cache else None
        root_cfg = self.select("data.root")
        try:
            source = instantiate(self.cfg.data.source)  # cheap: sources only derive paths here
        except Exception as err:
            cause = err.__cause__ if isinstance(err.__cause__, ConfigError) else err
            fallback = Path(str(root_cfg)).expanduser() if root_cfg else None
            return DataLocation(fallback, root_cfg is None, cache_dir, error_text(cause))
        root = getattr(source, "root", None)
        embedded = bool(getattr(source, "embedded", root_cfg is None))
        return DataLocation(Path(root) if root is not None else None, embedded, cache_dir)

    def checkpoint_bytes(self) -> tuple[int, str]:
        """Expected size of one checkpoint of the configured model, and how it was estimated."""
        if "checkpoint_bytes" not in self.memo:
            self.memo["checkpoint_bytes"] = self._estimate_checkpoint_bytes()
        return self.memo["checkpoint_bytes"]

    def _estimate_checkpoint_bytes(self) -> tuple[int, str]:
        import torch

        from drivebench.models import create_model

        name, size = self.select("model.name"), self.select("model.size")
        attempts = [("meta", torch.device("meta"))]
        if not self.skip_slow:  # some builders copy data at init and cannot run on the meta device
            attempts.append(("cpu", torch.device("cpu")))
        reasons = []
        for label, device in attempts:
            try:
                with device:
                    net = create_model(name, size)
                params = sum(p.numel() * p.element_size() for p in net.parameters())
                return CHECKPOINT_FACTOR * params, (f"{CHECKPOINT_FACTOR} x {params / 2**20:.0f} MiB of "
                                                    f"{name}/{size} parameters (built on {label})")
            except Exception as err:
                reasons.append(f"{label}: {error_text(err, 120)}")
        return FALLBACK_CHECKPOINT_BYTES, (f"assumed {FALLBACK_CHECKPOINT_BYTES // 2**20} MiB "
                                           f"({name}/{size} could not be built: {'; '.join(reasons)})")

    def header(self) -> dict[str, Any]:
        """Machine fingerprint and the run being checked (the ``--json`` header)."""
        return {
            "tool": "drivebench.doctor",
            "drivebench": drivebench.__version__,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "overrides": list(self.overrides),
            "run": {
                "model": self.select("model.name"), "model_size": self.select("model.size"),
                "data": self.select("data.name"), "accel": self.accel.name, "dist": self.select("dist.name"),
                "ckpt": self.select("ckpt.name"), "machine_profile": self.select("machine.name"),
            },
            "accel": self.accel.to_dict(),
            "machine": self.machine.to_dict(),
            "notes": list(self.notes),
        }


def build_context(overrides: list[str], skip_slow: bool = False) -> DoctorContext:
    """Compose, validate and resolve like a training run; ConfigError for anything a run would reject."""
    cfg = compose_config(overrides)
    notes: list[str] = []
    _validate(cfg, notes)
    raw_output = OmegaConf.to_container(cfg.paths, resolve=False).get("output_dir") if "paths" in cfg else None
    stand_in = None
    if isinstance(raw_output, str) and "${hydra:" in raw_output:
        stand_in = Path.cwd() / "outputs" / f"doctor-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
        cfg.paths.output_dir = str(stand_in)
        notes.append(f"paths.output_dir is the Hydra run directory, which exists only inside a run; "
                     f"the doctor tests {stand_in} (same filesystem as a run started here) and removes it")
    machine = detect_machine(str(OmegaConf.select(cfg, "machine.accelerator", default="auto")))
    try:
        accel_cfg = OmegaConf.to_container(cfg.accel, resolve=True)
    except Exception as err:
        raise ConfigError(f"accel does not resolve ({error_text(err)})") from err
    accel = AccelSettings.resolve(accel_cfg, machine)
    return DoctorContext(cfg=cfg, overrides=list(overrides), machine=machine, accel=accel, skip_slow=skip_slow,
                         output_stand_in=stand_in, notes=notes)


def _validate(cfg: DictConfig, notes: list[str]) -> None:
    """The training run's own config validation (model name and size, batch sizes, seed)."""
    try:
        from drivebench.app import validate
    except Exception as err:  # a broken dependency: the version checks will say which
        notes.append(f"drivebench.app does not import, config validation skipped ({error_text(err)})")
        return
    validate(cfg)
