"""Machine fingerprint: what a run ran on, so runs from different machines can be compared.

Everything here is read-only inspection (NVML, /proc, statvfs); nothing is benchmarked.
"""

from __future__ import annotations

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
    cpu_cores: int                  # logical cores this process may use
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


def _cpu_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


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
    info = MachineInfo(
        hostname=socket.gethostname(),
        cpu_model=_cpu_model(),
        cpu_cores=_cpu_cores(),
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
