"""What one drivebench job asks SLURM for, from its machine profile and its ``dist`` group.

Pure functions of the composed job config, so the dispatch can be checked without a cluster. The
names are submitit's generic parameters (``nodes``, ``tasks_per_node``, ``gpus_per_node``,
``cpus_per_task``, ``mem_gb``, ``timeout_min``, ``name``) plus the SLURM-only ones
(``partition``, ``account``, ``qos``, ``constraint``); None means "not set by the profile".

One task per GPU: Lightning's SLURM environment then finds its ranks from ``SLURM_PROCID`` /
``SLURM_LOCALID`` and checks that ``--ntasks-per-node`` equals ``dist.devices``.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from drivebench.errors import ConfigError

SLURM_ONLY = ("partition", "account", "qos", "constraint")


def _count(value: Any, key: str, profile: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{key}={value!r} (machine={profile}) is not valid for a SLURM submission; "
                          f"set a whole number >= 1 in drivebench/conf/machine/{profile}.yaml")
    return value


def gpus_per_node(cfg: DictConfig) -> int:
    """GPUs (= tasks) per node: ``dist.devices``, or the profile's ``gpus_per_node`` for ``auto``."""
    machine, dist = cfg.machine, cfg.dist
    offered = _count(machine.get("gpus_per_node"), "machine.gpus_per_node", machine.name)
    if dist.strategy != "ddp":
        return 1
    if dist.devices == "auto":
        return offered
    devices = _count(dist.devices, "dist.devices", machine.name)
    if devices > offered:
        raise ConfigError(f"dist.devices={devices} but machine={machine.name} gives a job {offered} GPU(s) per node "
                          f"(machine.gpus_per_node); lower dist.devices or raise machine.gpus_per_node")
    return devices


def job_resources(cfg: DictConfig) -> dict[str, Any]:
    """The submission parameters of one composed job config (see the module docstring)."""
    machine, dist = cfg.machine, cfg.dist
    profile = machine.name
    slurm = machine.get("slurm")
    if not slurm:
        raise ConfigError(f"machine={profile} has no slurm block, so hydra/launcher=drivebench_slurm cannot submit "
                          f"it; choose a profile that has one (machine=h200, machine=a100, or your own in "
                          f"drivebench/conf/machine/) or leave out hydra/launcher=drivebench_slurm")
    if machine.accelerator != "gpu":
        raise ConfigError(f"machine={profile} has accelerator={machine.accelerator}; SLURM dispatch needs a GPU "
                          f"profile (accelerator: gpu)")
    nodes = _count(dist.num_nodes, "dist.num_nodes", profile)
    if nodes > 1 and dist.strategy != "ddp":
        raise ConfigError(f"dist.num_nodes={nodes} needs dist=ddp (one process per GPU across the nodes)")
    gpus = gpus_per_node(cfg)
    cpus = machine.get("cpus_per_gpu")
    mem = machine.get("mem_gb_per_gpu")
    resources: dict[str, Any] = {
        "name": f"drivebench-{profile}-{cfg.model.name}",
        "nodes": nodes,
        "tasks_per_node": gpus,
        "gpus_per_node": gpus,
        "cpus_per_task": _count(cpus, "machine.cpus_per_gpu", profile) if cpus is not None else None,
        "mem_gb": mem * gpus if mem is not None else None,
        "timeout_min": slurm.get("timeout_min"),
    }
    resources.update({key: slurm.get(key) for key in SLURM_ONLY})
    return resources


def describe(resources: dict[str, Any]) -> str:
    """One line for the launcher's log: where the job goes and what it asks for."""
    shown = ("partition", "nodes", "gpus_per_node", "tasks_per_node", "cpus_per_task", "mem_gb", "timeout_min",
             "account", "qos", "constraint")
    return " ".join(f"{key}={resources[key]}" for key in shown if resources.get(key) is not None)
