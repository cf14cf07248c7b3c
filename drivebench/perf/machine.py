"""Machine fingerprint: what a run ran on, so runs from different machines can be compared.

Everything here is read-only inspection (NVML, /proc, statvfs); nothing is benchmarked.
"""

from __future__ import annotations

import math
import os
import platform
import shutil
import socket
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil
import torch

from drivebench.hardware import nvml


@dataclass
class GPUInfo:
    index: int
    name: str
    memory_gb: float
    capability: str


@dataclass
class MachineInfo:
    """The facts the accel presets resolve against and the summary records."""

    hostname: str
    cpu_model: str
    cpu_cores: int                  # logical cores this process may use (affinity and cgroup CPU quota)
    ram_gb: float
    shm_gb: float | None            # size of /dev/shm
    shm_free_gb: float | None
    accelerator: str                # "cuda" or "cpu"
    gpus: list[GPUInfo] = field(default_factory=list)
    driver: str | None = None
    cuda: str | None = None
    cudnn: int | None = None
    nccl: str | None = None
    torch: str = torch.__version__
    python: str = platform.python_version()
    bf16_supported: bool = False
    cpu_cores_source: str = "given"  # where cpu_cores came from (see usable_cores)

    @property
    def num_devices(self) -> int:
        return max(len(self.gpus), 1)

    @property
    def cores_per_device(self) -> int:
        return max(self.cpu_cores // self.num_devices, 1)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@dataclass
class CoreCount:
    """The cores this process may use, and where the number came from."""

    cores: int
    source: str                     # e.g. "affinity (2 CPUs)" or "cgroup cpu.max 150000/100000 (1.5 CPUs)"
    affinity: int                   # CPUs in os.sched_getaffinity (os.cpu_count() where there is none)
    cpu_count: int | None           # os.cpu_count(): the machine's, not this process's
    quota_cpus: float | None        # the cgroup CPU quota in CPUs (None: no quota)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _quota_at(directory: Path, v2: bool) -> tuple[float, str] | None:
    """The CPU quota set in one cgroup directory, as (CPUs, what was read); None when unlimited."""
    if v2:
        raw = _read(directory / "cpu.max")  # "max 100000" (no limit) or "<quota> <period>"
        parts = raw.split() if raw else []
        quota, period = (parts[0], parts[1]) if len(parts) == 2 else (None, None)
        where = f"{directory / 'cpu.max'} {raw}"
    else:
        quota, period = _read(directory / "cpu.cfs_quota_us"), _read(directory / "cpu.cfs_period_us")
        where = f"{directory / 'cpu.cfs_quota_us'} {quota}/{period}"
    try:
        q, p = float(quota), float(period)  # type: ignore[arg-type]
    except (TypeError, ValueError):  # "max", absent files
        return None
    return (q / p, f"cgroup {where}") if q > 0 and p > 0 else None  # v1 writes -1 for no limit


def _cgroup_quota(proc_cgroup: Path, cgroup_root: Path) -> tuple[float, str] | None:
    """The tightest CPU quota over this process's cgroup and its ancestors (cgroup v2 ``cpu.max``,
    v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``), as (CPUs, what was read)."""
    text = _read(proc_cgroup)
    best: tuple[float, str] | None = None
    for line in (text or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        controllers, rel = parts[1], parts[2]
        v2 = controllers == ""
        if not v2 and "cpu" not in controllers.split(","):
            continue
        names = [cgroup_root, cgroup_root / "unified"] if v2 else [
            cgroup_root / controllers, cgroup_root / "cpu", cgroup_root / "cpu,cpuacct"]
        mount = next((m for m in names if m.is_dir()), None)
        if mount is None:
            continue
        level = Path(rel.lstrip("/"))
        for directory in [mount / level, *(mount / parent for parent in level.parents)]:
            found = _quota_at(directory, v2)
            if found is not None and (best is None or found[0] < best[0]):
                best = found
    return best


def usable_cores(proc_cgroup: Path = Path("/proc/self/cgroup"), cgroup_root: Path = Path("/sys/fs/cgroup")) -> CoreCount:
    """Cores this process may use: its CPU affinity, lowered to a cgroup CPU quota when there is one.

    Why not ``os.cpu_count()``: a container limited by affinity (cpuset) or by a CFS quota still sees
    every core of the host there, and thread pools sized to it oversubscribe the cores it may use.
    A quota of 1.5 CPUs counts as 1 core (whole cores, at least 1).
    """
    count = os.cpu_count()
    try:
        affinity = len(os.sched_getaffinity(0))
        source = f"affinity ({affinity} of {count} CPUs)"
    except AttributeError:  # not on Linux
        affinity = count or 1
        source = f"os.cpu_count ({affinity} CPUs; no affinity on this OS)"
    quota = _cgroup_quota(proc_cgroup, cgroup_root)
    cores = affinity
    if quota is not None and quota[0] < affinity:
        cores = max(int(math.floor(quota[0] + 1e-9)), 1)
        source = f"{quota[1]} ({quota[0]:g} CPUs, below the affinity of {affinity})"
    return CoreCount(cores, source, affinity, count, quota[0] if quota else None)


def _shm() -> tuple[float | None, float | None]:
    try:
        usage = shutil.disk_usage("/dev/shm")
    except OSError:
        return None, None
    return usage.total / 2**30, usage.free / 2**30


def detect_machine(accelerator: str = "auto") -> MachineInfo:
    """Inspect this machine. ``accelerator`` (auto | gpu | cpu) restricts what is used."""
    use_cuda = torch.cuda.is_available() and accelerator in ("auto", "gpu", "cuda")
    shm_total, shm_free = _shm()
    cores = usable_cores()
    info = MachineInfo(
        hostname=socket.gethostname(),
        cpu_model=_cpu_model(),
        cpu_cores=cores.cores,
        cpu_cores_source=cores.source,
        ram_gb=psutil.virtual_memory().total / 2**30,
        shm_gb=shm_total,
        shm_free_gb=shm_free,
        accelerator="cuda" if use_cuda else "cpu",
    )
    if use_cuda:
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            info.gpus.append(GPUInfo(i, props.name, props.total_memory / 2**30, f"{props.major}.{props.minor}"))
        driver = nvml.driver_info()  # None: no NVML library or no driver
        info.driver = driver[0] if driver else None
        info.cuda = torch.version.cuda
        info.cudnn = torch.backends.cudnn.version()
        try:
            info.nccl = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:  # torch built without NCCL
            info.nccl = None
        info.bf16_supported = torch.cuda.is_bf16_supported()
    return info


# Filesystem types that live on another machine (mount types as /proc/mounts names them); any
# "fuse*" type counts too (sshfs, gcsfuse, s3fs, ... mounted through FUSE)
NETWORK_FS = frozenset({"nfs", "nfs4", "cifs", "smb", "smb3", "smbfs", "lustre", "gpfs", "beegfs", "ceph", "cephfs",
                        "glusterfs", "panfs", "wekafs", "afs", "9p", "virtiofs", "ocfs2", "davfs", "sshfs"})


def is_network_fs(fstype: str | None) -> bool:
    """A network or FUSE mount: writes and reads cross a link, and may be much slower than local disk."""
    return bool(fstype) and (fstype in NETWORK_FS or fstype.startswith("fuse"))  # type: ignore[union-attr]


def filesystem_of(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Mount point, filesystem type and free space of the filesystem holding ``path``."""
    target = Path(path).resolve()
    probe = target
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    best = None
    for part in psutil.disk_partitions(all=True):
        mount = Path(part.mountpoint)
        if probe == mount or mount in probe.parents:
            if best is None or len(str(mount)) > len(best.mountpoint):
                best = part
    free_gb = shutil.disk_usage(probe).free / 2**30 if probe.exists() else None
    if best is None:
        return {"path": str(target), "mount": None, "fstype": None, "free_gb": free_gb}
    return {"path": str(target), "mount": best.mountpoint, "fstype": best.fstype, "free_gb": free_gb}
