"""Family 7: the launcher's environment, SLURM, and whether ``dist.devices`` exists here.

Lightning decides how processes are started from environment variables: with LOCAL_RANK set it
assumes an outside launcher started every process and waits for the others, so a stale LOCAL_RANK
left by another job (or a ``--local_rank`` from an old launcher without the rest) makes a DDP run
wait forever. TorchElastic (torchrun) wins over SLURM, which wins over Lightning's own launcher.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

from drivebench.doctor.context import DoctorContext
from drivebench.doctor.result import Check, CheckResult, failed, informed, passed
from drivebench.errors import ConfigError

LAUNCHER_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
NUMERIC_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_PORT")
SLURM_SHOWN = ("SLURM_JOB_ID", "SLURM_JOB_NAME", "SLURM_NTASKS", "SLURM_NTASKS_PER_NODE", "SLURM_NNODES",
               "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID")
TORCHRUN_HINT = "launch with `torchrun --nproc_per_node=<GPUs> -m drivebench ...`, which sets all six consistently"


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def launcher_problems(env: dict[str, str]) -> list[str]:
    """Inconsistencies in RANK / LOCAL_RANK / WORLD_SIZE / LOCAL_WORLD_SIZE / MASTER_ADDR / MASTER_PORT."""
    present = [k for k in LAUNCHER_VARS if k in env]
    if not present:
        return []
    problems = [f"{k}={env[k]!r} is not a whole number" for k in NUMERIC_VARS if k in env and _int(env[k]) is None]
    missing = [k for k in LAUNCHER_VARS if k not in env]
    if missing:
        problems.append(f"{', '.join(present)} set but {', '.join(missing)} missing (a launcher sets all or none)")
    rank, world = _int(env.get("RANK")), _int(env.get("WORLD_SIZE"))
    local, local_world = _int(env.get("LOCAL_RANK")), _int(env.get("LOCAL_WORLD_SIZE"))
    port = _int(env.get("MASTER_PORT"))
    if world is not None and world < 1:
        problems.append(f"WORLD_SIZE={world} < 1")
    if rank is not None and world is not None and not 0 <= rank < world:
        problems.append(f"RANK={rank} is not below WORLD_SIZE={world}")
    if local is not None and local_world is not None and not 0 <= local < local_world:
        problems.append(f"LOCAL_RANK={local} is not below LOCAL_WORLD_SIZE={local_world}")
    if local_world is not None and world is not None and local_world > world:
        problems.append(f"LOCAL_WORLD_SIZE={local_world} exceeds WORLD_SIZE={world}")
    if port is not None and not 0 < port < 65536:
        problems.append(f"MASTER_PORT={port} is not a TCP port")
    return problems


def launcher_env(ctx: DoctorContext) -> CheckResult:
    """RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT: all or none, and consistent."""
    env = dict(os.environ)
    present = {k: env[k] for k in LAUNCHER_VARS if k in env}
    data: dict[str, Any] = {"env": present, "torchelastic": "TORCHELASTIC_RUN_ID" in env}
    if not present:
        return passed("no launcher variables: one process here; Lightning starts any DDP workers itself", data)
    problems = launcher_problems(env)
    shown = ", ".join(f"{k}={v}" for k, v in present.items())
    if problems:
        return failed(f"{shown}: {'; '.join(problems)}",
                      f"{TORCHRUN_HINT}; or `unset {' '.join(LAUNCHER_VARS)}` if they are left over from another "
                      "job (with LOCAL_RANK set, Lightning waits for processes nobody starts)", data)
    by = "torchrun" if data["torchelastic"] else "an outside launcher"
    return passed(f"started by {by}: {shown}", data)


def _lightning_sees_slurm() -> tuple[bool | None, bool | None]:
    """(SLURMEnvironment.detect(), TorchElasticEnvironment.detect()), None where Lightning is absent."""
    try:
        from lightning.fabric.plugins.environments import SLURMEnvironment, TorchElasticEnvironment
    except Exception:
        return None, None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "srun exists but is not used" is our message to give, not Lightning's
        return bool(SLURMEnvironment.detect()), bool(TorchElasticEnvironment.detect())


def resolved_devices(ctx: DoctorContext) -> int:
    """``dist.devices`` as the run resolves it (:func:`drivebench.dist.resolve_devices`); ConfigError if invalid."""
    from drivebench.dist import resolve_devices

    accelerator = "gpu" if ctx.machine.accelerator == "cuda" else "cpu"
    return resolve_devices(ctx.cfg.dist, len(ctx.machine.gpus), accelerator)


def _devices_or_none(ctx: DoctorContext) -> int | None:
    try:
        return resolved_devices(ctx)
    except Exception:  # reported by launcher.devices
        return None


def slurm_env(ctx: DoctorContext) -> CheckResult:
    """SLURM variables, whether Lightning would detect a SLURM job, and whether its task layout matches dist."""
    env = os.environ
    slurm = {k: env[k] for k in SLURM_SHOWN if k in env}
    if not any(k.startswith("SLURM_") for k in env):
        return informed("not a SLURM job")
    detected, elastic = _lightning_sees_slurm()
    shown = ", ".join(f"{k}={v}" for k, v in slurm.items()) or "SLURM_* variables"
    data: dict[str, Any] = {"env": slurm, "lightning_detects_slurm": detected, "torchelastic": elastic}
    if elastic:
        return passed(f"{shown}; torchrun's variables are present and Lightning prefers them over SLURM's", data)
    if not detected:
        name = env.get("SLURM_JOB_NAME")
        why = (f"the job name is {name!r}" if name in ("bash", "interactive")
               else "SLURM_NTASKS is not set (not started by srun)")
        return informed(f"{shown}; Lightning does not treat this as a SLURM job ({why}) and starts DDP workers itself",
                        "to let SLURM start one task per GPU: `srun --ntasks-per-node=<GPUs> python -m drivebench ...`",
                        data)
    problems = []
    ntasks, per_node = _int(env.get("SLURM_NTASKS")), env.get("SLURM_NTASKS_PER_NODE")
    if ntasks and ntasks > 1 and per_node is None:
        problems.append(f"SLURM_NTASKS={ntasks} without SLURM_NTASKS_PER_NODE (Lightning rejects --ntasks; use "
                        "--ntasks-per-node)")
    device_count = _devices_or_none(ctx)
    if per_node is not None and _int(per_node) is not None and device_count is not None and \
            _int(per_node) != device_count:
        problems.append(f"SLURM_NTASKS_PER_NODE={per_node} but dist.devices resolves to {device_count}")
    nnodes, num_nodes = _int(env.get("SLURM_NNODES")), ctx.select("dist.num_nodes", 1)
    if nnodes is not None and nnodes != num_nodes:
        problems.append(f"SLURM_NNODES={nnodes} but dist.num_nodes={num_nodes}")
    procid, localid = _int(env.get("SLURM_PROCID")), _int(env.get("SLURM_LOCALID"))
    if procid is not None and ntasks is not None and procid >= ntasks:
        problems.append(f"SLURM_PROCID={procid} is not below SLURM_NTASKS={ntasks}")
    if localid is not None and _int(per_node) is not None and localid >= _int(per_node):  # type: ignore[operator]
        problems.append(f"SLURM_LOCALID={localid} is not below SLURM_NTASKS_PER_NODE={per_node}")
    if problems:
        return failed(f"{shown}; Lightning detects SLURM: {'; '.join(problems)}",
                      "request one task per GPU: `#SBATCH --ntasks-per-node=<GPUs> --nodes=<N>` with "
                      "dist.devices=<GPUs> dist.num_nodes=<N>, and start with `srun python -m drivebench ...`", data)
    return passed(f"{shown}; Lightning detects SLURM and its task layout matches dist", data)


def devices_check(ctx: DoctorContext) -> CheckResult:
    """``dist.devices`` against the GPUs present (and against torchrun's LOCAL_WORLD_SIZE)."""
    raw = ctx.select("dist.devices", 1)
    gpus = len(ctx.machine.gpus)
    strategy = ctx.select("dist.strategy", "auto")
    data: dict[str, Any] = {"devices": raw, "gpus": gpus, "strategy": strategy, "accelerator": ctx.machine.accelerator}
    try:
        count = resolved_devices(ctx)
    except ConfigError as err:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "unset")
        return failed(f"{err} (CUDA_VISIBLE_DEVICES={visible})",
                      f"dist.devices=auto ({'all ' + str(gpus) + ' GPUs' if gpus else 'no GPU here'}) or a number up "
                      f"to {max(gpus, 1)}", data)
    data["resolved"] = count
    if ctx.machine.accelerator == "cuda":
        saw = f"dist.devices={raw} -> {count} of {gpus} GPU(s), strategy={strategy}"
    else:
        explicit_cpu = str(ctx.select("machine.accelerator", "auto")) == "cpu"
        if count > 1 and not explicit_cpu and raw != "auto":
            return failed(f"dist.devices={raw} but this machine has no GPU (the run would start {count} CPU "
                          "processes)", "run on a GPU machine, or dist.devices=1 here (machine.accelerator=cpu if "
                                        f"you mean {count} CPU processes)", data)
        saw = f"dist.devices={raw} -> {count} CPU process(es), strategy={strategy}"
    local_world = _int(os.environ.get("LOCAL_WORLD_SIZE"))
    if local_world is not None and local_world != count:
        return failed(saw + f"; torchrun started LOCAL_WORLD_SIZE={local_world} processes on this node",
                      f"make them agree: torchrun --nproc_per_node={count}, or dist.devices={local_world}", data)
    return passed(saw, data)


CHECKS = [
    Check("launcher.env", launcher_env),
    Check("launcher.slurm", slurm_env),
    Check("launcher.devices", devices_check),
]
