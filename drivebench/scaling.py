"""``+experiment=scaling``'s two rules for each job: the per-device batch, and a job the machine cannot hold.

The batch (``experiment.batch``): ``per_device`` keeps ``model.batch_size`` on every device, so the
global batch grows with ``dist.devices``; ``global`` keeps the global batch at
``experiment.global_batch`` (null: 8 x the model's per-device batch, upstream's 8 GPUs) and gives each
device ``global_batch / dist.devices``. A global batch that does not divide is refused in one line
while Hydra composes the job (``ScalingExperimentConfig.__post_init__``), so a sweep with such a job
stops before its first job runs.

A job asking for more GPUs than the machine has (``dist.TooFewDevices``) is skipped when
``experiment.unavailable_devices=skip``: it writes a ``summary.json`` with ``run.status: skipped``
and the reason, instead of training, and the sweep goes on with its next job. The report lists it
with its reason; a sweep of 1, 2, 4, 8 devices run on a 4-GPU host thus records what it could not
measure instead of stopping at the first 8-device job.
"""

from __future__ import annotations

import datetime as dt
import sys
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from drivebench.errors import ConfigError, bad_choice

UPSTREAM_DEVICES = 8  # experiment.global_batch=null: the global batch of upstream's 8-GPU recipes
SKIPPED = "skipped"


def per_device_batch(mode: str, global_batch: int | None, devices: Any, model_batch: Any) -> int:
    """The per-device batch of one job under ``experiment.batch=mode`` (ConfigError, one line, if none)."""
    from drivebench.schemas import BATCH_MODES

    if mode not in BATCH_MODES:
        raise bad_choice("experiment.batch", mode, BATCH_MODES)
    if mode == "per_device":
        return model_batch
    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
        raise ConfigError(f"dist.devices={devices!r} is not valid with experiment.batch=global: the global batch is "
                          "split over a known number of devices; give a whole number >= 1")
    total = global_batch if global_batch is not None else UPSTREAM_DEVICES * model_batch
    if isinstance(total, bool) or not isinstance(total, int) or total < 1:
        raise ConfigError(f"experiment.global_batch={total!r} is not valid; use a whole number >= 1 (or null)")
    if total % devices:
        raise ConfigError(f"experiment.global_batch={total} does not divide over dist.devices={devices} "
                          f"(experiment.batch=global gives each device global_batch / devices); use a multiple of "
                          f"{devices}, or experiment.batch=per_device")
    return total // devices


def apply_batch(cfg: DictConfig) -> None:
    """Set ``model.batch_size`` for this job from ``experiment`` (nothing without an ``experiment.batch``).

    The experiment node then holds the numbers the run used (``devices``, ``model_batch`` and, under
    ``global``, ``global_batch``) instead of interpolations that would follow the new batch size.
    """
    node = cfg.get("experiment")
    if not isinstance(node, DictConfig) or "batch" not in node:
        return
    devices, model_batch = node.devices, node.model_batch
    batch = per_device_batch(node.batch, node.global_batch, devices, model_batch)
    with _writable(node):
        node.devices, node.model_batch = devices, model_batch
        if node.batch == "global":
            node.global_batch = batch * devices
    cfg.model.batch_size = batch


class _writable:
    """Lift a node's read-only flag for a moment (a config may be made read-only by its owner)."""

    def __init__(self, node: DictConfig) -> None:
        self.node, self.was = node, OmegaConf.is_readonly(node)

    def __enter__(self) -> None:
        OmegaConf.set_readonly(self.node, False)

    def __exit__(self, *exc: Any) -> None:
        OmegaConf.set_readonly(self.node, self.was)


def skips_unavailable_devices(cfg: DictConfig) -> bool:
    """Whether a job asking for more devices than this machine has is skipped rather than refused."""
    return OmegaConf.select(cfg, "experiment.unavailable_devices") == "skip"


def write_skipped(cfg: DictConfig, output_dir: Path, reason: str, started: float | None = None) -> dict[str, Any]:
    """The job's ``summary.json`` for a job that did not run: what was asked, on which machine, and why."""
    from drivebench.perf.machine import detect_machine
    from drivebench.perf.summary import SCHEMA_VERSION, write_summary
    from drivebench.secrets import redact, redact_argv

    now = dt.datetime.now().isoformat(timespec="seconds")
    machine = detect_machine(cfg.machine.accelerator)
    summary: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "run": {
            "model": cfg.model.name, "model_size": cfg.model.size, "data": cfg.data.name, "accel": cfg.accel.name,
            "bench": cfg.bench.get("mode"), "dist": cfg.dist.name, "machine_profile": cfg.machine.name,
            "seed": cfg.seed, "started": dt.datetime.fromtimestamp(started or time.time()).isoformat(timespec="seconds"),
            "finished": now, "command": " ".join(redact_argv(sys.argv)), "status": SKIPPED,
            "output_dir": str(output_dir),
        },
        "skipped": {"reason": reason, "key": "experiment.unavailable_devices", "value": "skip",
                    "devices": OmegaConf.select(cfg, "dist.devices"), "p2p": _p2p_text(cfg),
                    "gpus_here": len(machine.gpus)},
        "machine": machine.to_dict(),
        "experiment": OmegaConf.to_container(cfg.experiment, resolve=True),
        "config": redact(OmegaConf.to_container(cfg, resolve=False)),
        "paths": {"output_dir": str(output_dir)},
    }
    summary["paths"]["summary"] = str(write_summary(output_dir / "summary.json", summary))
    print(f"drivebench: skipped: {reason} (experiment.unavailable_devices=skip; recorded in "
          f"{output_dir / 'summary.json'})", file=sys.stderr, flush=True)
    return summary


def _p2p_text(cfg: DictConfig) -> str | None:
    value = OmegaConf.select(cfg, "dist.p2p")
    if isinstance(value, bool):
        return "on" if value else "off"
    return None if value is None else str(value)
