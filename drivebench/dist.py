"""Distributed runs on the engines users already have (Lightning DDP, torchrun, SLURM), made robust.

Three things go wrong with Lightning + Hydra + DDP out of the box (Lightning-AI #11300, #2727,
lightning-hydra-template #393); each is fixed here, narrowly:

1. Lightning re-launches rank processes with the parent's whole ``sys.argv``: under ``-m`` every
   rank would start the whole sweep again. :func:`patch_rank_launch_command` makes the children
   run exactly this job (its resolved overrides, no ``-m``) in this job's directory.
2. After one job of a multirun, the rank-0 process keeps ``LOCAL_RANK``/``MASTER_PORT``/... and an
   initialised process group; the next job would not launch its ranks and hang. :class:`DistJob`
   waits for the job's rank processes, destroys the process group and restores the environment.
3. Under torchrun every rank runs Hydra and would create its own timestamped output directory:
   :func:`external_rank_overrides` sends ranks > 0 to a scratch directory, so one run directory
   (rank 0's) holds the run; the summary gathers every rank's figures there.

``dist.p2p`` is applied to the environment before any process group exists (:func:`apply_p2p`).
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import sys
import tempfile
from typing import Any

import torch

from drivebench.errors import ConfigError

log = logging.getLogger(__name__)

P2P_LEVELS = ("LOC", "NVL", "PIX", "PXB", "PHB", "SYS")
_DIST_ENV = ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "NCCL_P2P_DISABLE",
             "NCCL_P2P_LEVEL", "PL_GLOBAL_SEED")


def apply_p2p(p2p: Any, cache_dir: str | None = None, environ: dict[str, str] | None = None) -> dict[str, Any]:
    """Set NCCL's peer-to-peer variables for ``dist.p2p`` and say what was applied.

    ``on``: P2P allowed (NCCL_P2P_DISABLE removed); ``off``: NCCL_P2P_DISABLE=1; a level (LOC, NVL,
    PIX, PXB, PHB, SYS): NCCL_P2P_LEVEL; ``auto``: the doctor's cached verdict if there is one,
    else NCCL's own default.
    """
    env = os.environ if environ is None else environ
    requested = str(p2p)
    source = "config"
    value = requested.upper() if requested.upper() in P2P_LEVELS else requested.lower()
    if value == "auto":
        verdict = None
        if cache_dir:
            try:
                from drivebench.doctor.p2p import cached_p2p_verdict
                from pathlib import Path

                verdict = cached_p2p_verdict(Path(cache_dir))
            except Exception as err:  # a missing or unreadable cache is not an error
                log.debug("no cached P2P verdict: %s", err)
        if verdict is None:
            return {"requested": requested, "applied": "nccl-default", "source": "nccl default (no doctor verdict)",
                    "env": _nccl_env(env)}
        value, source = (verdict.upper() if verdict.upper() in P2P_LEVELS else verdict.lower()), "doctor cache"
    if value == "on":
        env.pop("NCCL_P2P_DISABLE", None)
        env.pop("NCCL_P2P_LEVEL", None)
    elif value == "off":
        env["NCCL_P2P_DISABLE"] = "1"
        env.pop("NCCL_P2P_LEVEL", None)
    elif value in P2P_LEVELS:
        env.pop("NCCL_P2P_DISABLE", None)
        env["NCCL_P2P_LEVEL"] = value
    else:
        raise ConfigError(f"dist.p2p={requested!r} is not valid; choose one of: auto, on, off, {', '.join(P2P_LEVELS)}")
    return {"requested": requested, "applied": value, "source": source, "env": _nccl_env(env)}


def _nccl_env(env: Any) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith("NCCL_")}


def build_strategy(dist_cfg: Any, accelerator: str) -> Any:
    """Lightning strategy for ``dist``: "auto" for one process, a configured DDPStrategy otherwise."""
    if dist_cfg.strategy != "ddp":
        return dist_cfg.strategy
    from lightning.pytorch.strategies import DDPStrategy

    backend = dist_cfg.get("backend") or ("nccl" if accelerator == "gpu" else "gloo")
    if backend == "nccl" and accelerator != "gpu":
        raise ConfigError("dist.backend=nccl needs GPUs but this run is on the CPU; use dist.backend=gloo "
                          "(or leave dist.backend unset)")
    if backend not in ("nccl", "gloo", "mpi"):
        raise ConfigError(f"dist.backend={backend!r} is not valid; choose one of: nccl, gloo, mpi")
    return DDPStrategy(
        process_group_backend=backend,
        find_unused_parameters=bool(dist_cfg.find_unused_parameters),
        gradient_as_bucket_view=bool(dist_cfg.gradient_as_bucket_view),
        static_graph=bool(dist_cfg.static_graph),
        timeout=dt.timedelta(minutes=float(dist_cfg.get("timeout_minutes", 10))),
    )


def resolve_devices(dist_cfg: Any, num_gpus: int, accelerator: str) -> int:
    devices = dist_cfg.devices
    if devices == "auto":
        return num_gpus if (accelerator == "gpu" and num_gpus) else (2 if dist_cfg.strategy == "ddp" else 1)
    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
        raise ConfigError(f"dist.devices={devices!r} is not valid; use a whole number >= 1 or auto")
    if accelerator == "gpu" and devices > num_gpus:
        raise ConfigError(f"dist.devices={devices} but this machine has {num_gpus} GPU(s); lower dist.devices")
    return devices


# ---- Hydra + Lightning's rank launcher -------------------------------------------------------------
def _rank_command(local_rank: int) -> tuple[list[str], str]:
    """The command Lightning's launcher runs for rank ``local_rank`` of this Hydra job."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.utils import get_original_cwd

    hc = HydraConfig.get()
    overrides = [o for o in hc.overrides.task]
    command = [sys.executable, "-m", "drivebench", *overrides,
               f"hydra.run.dir={hc.runtime.output_dir}", "hydra.output_subdir=null",
               f"hydra.job.name=rank{local_rank}", "hydra/job_logging=none", "hydra/hydra_logging=none"]
    return command, get_original_cwd()


def patch_rank_launch_command() -> None:
    """Make Lightning launch rank processes for this job only (see module docstring, point 1)."""
    from lightning.fabric.strategies.launchers import subprocess_script as fabric_launcher
    from lightning.pytorch.strategies.launchers import subprocess_script as trainer_launcher

    fabric_launcher._hydra_subprocess_cmd = _rank_command
    trainer_launcher._hydra_subprocess_cmd = _rank_command  # imported by name there


def external_rank_overrides(environ: dict[str, str] | None = None) -> list[str]:
    """Hydra overrides for ranks > 0 started by an external launcher (torchrun, SLURM)."""
    env = os.environ if environ is None else environ
    rank = env.get("RANK") or env.get("SLURM_PROCID")
    if rank is None or int(rank) == 0 or "TORCHELASTIC_RUN_ID" not in env and "SLURM_PROCID" not in env:
        return []
    scratch = os.path.join(tempfile.gettempdir(), f"drivebench-rank{rank}-{os.getpid()}")
    return [f"hydra.run.dir={scratch}", "hydra.output_subdir=null", "hydra/job_logging=none",
            "hydra/hydra_logging=none"]


class DistJob:
    """Context for one Hydra job: restores the environment and tears DDP down when the job ends."""

    def __init__(self, child_timeout_s: float = 120.0) -> None:
        self._saved = {k: os.environ.get(k) for k in _DIST_ENV}
        self.trainers: list[Any] = []
        self.child_timeout_s = child_timeout_s

    def __enter__(self) -> "DistJob":
        return self

    def track(self, trainer: Any) -> None:
        self.trainers.append(trainer)

    def __exit__(self, *exc: Any) -> None:
        # every rank leaves the process group first (NCCL teardown waits for its peers), then
        # rank 0 waits for the rank processes it launched
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        for trainer in self.trainers:
            launcher = getattr(trainer.strategy, "launcher", None)
            for proc in getattr(launcher, "procs", []) or []:
                try:
                    proc.wait(timeout=self.child_timeout_s)
                except Exception:
                    log.error("rank process %s did not exit within %ss; killing it", proc.pid, self.child_timeout_s)
                    proc.kill()
        for key, value in self._saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def gather_objects(obj: Any) -> list[Any]:
    """Every rank's ``obj`` on every rank (a list of one outside DDP)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return [obj]
    out: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(out, obj)
    return out
