"""Read-only NVML queries: the driver, the GPUs this process may use, how two GPUs are linked, and
an open handle on one CUDA device for a sampler.

Why NVML and not torch: the P2P verdict is needed before any CUDA context exists (the training
launcher reads it before it spawns its workers), NVML knows the PCIe/NVLink topology, which CUDA
does not expose, and only NVML reports a device's busy time.

Why by UUID: NVML numbers every GPU of the machine in PCI order and ignores
``CUDA_VISIBLE_DEVICES``; CUDA numbers only the visible ones. CUDA device 0 of a run pinned to
``CUDA_VISIBLE_DEVICES=2,3`` is NVML device 2, so asking NVML by the CUDA index reads another GPU.
:func:`cuda_device_uuid` gives the UUID of a CUDA device and NVML is asked by that. Every function
returns None where NVML is absent (no library, no driver).
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Any, Iterator

# NVML's common-ancestor levels, mapped to the NCCL_P2P_LEVEL a path of that kind needs
_TOPOLOGY_TO_NCCL = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "PHB", 50: "SYS"}


@contextmanager
def _session() -> Iterator[Any]:
    import pynvml

    pynvml.nvmlInit()
    try:
        yield pynvml
    finally:
        pynvml.nvmlShutdown()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _nvml_uuid(uuid: str) -> str:
    """NVML's spelling of a UUID: torch gives the bare hex form, NVML wants the ``GPU-`` prefix."""
    return uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"


def device_count() -> int | None:
    """GPUs the driver lists (all of them, whatever CUDA_VISIBLE_DEVICES says)."""
    try:
        with _session() as nv:
            return int(nv.nvmlDeviceGetCount())
    except Exception:  # no library, no driver
        return None


def driver_info() -> tuple[str, str | None] | None:
    """``(driver version, newest CUDA version it supports)``, e.g. ``("570.86.15", "12.8")``."""
    try:
        with _session() as nv:
            driver = _text(nv.nvmlSystemGetDriverVersion())
            try:
                code = int(nv.nvmlSystemGetCudaDriverVersion_v2())
                cuda = f"{code // 1000}.{(code % 1000) // 10}"
            except Exception:
                cuda = None
            return driver, cuda
    except Exception:
        return None


def _all_devices(nv: Any) -> list[tuple[str, str]]:
    """(name, UUID) of every GPU, in NVML order."""
    devices = []
    for i in range(nv.nvmlDeviceGetCount()):
        handle = nv.nvmlDeviceGetHandleByIndex(i)
        devices.append((_text(nv.nvmlDeviceGetName(handle)), _text(nv.nvmlDeviceGetUUID(handle))))
    return devices


def _follow_visible(devices: list[tuple[str, str]]) -> list[tuple[str, str]] | None:
    """The CUDA-visible subset of ``devices`` in CUDA order, as CUDA reads CUDA_VISIBLE_DEVICES
    (indices or unique ``GPU-`` UUID prefixes; CUDA stops at the first entry it cannot use). None
    for MIG ids, which this does not follow."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return list(devices)
    chosen: list[tuple[str, str]] = []
    for token in (t.strip() for t in visible.split(",")):
        if token.isdigit() and int(token) < len(devices):
            chosen.append(devices[int(token)])
        elif token.startswith("GPU-"):
            match = [d for d in devices if d[1].startswith(token)]
            if len(match) != 1:
                break
            chosen.append(match[0])
        elif token.startswith("MIG-"):
            return None
        else:
            break
    return chosen


def visible_devices() -> list[tuple[str, str]] | None:
    """(name, UUID) of the GPUs this process may use, in CUDA order, following CUDA_VISIBLE_DEVICES.

    Without initialising CUDA. None when NVML is absent or CUDA_VISIBLE_DEVICES names MIG devices.
    """
    try:
        with _session() as nv:
            devices = _all_devices(nv)
    except Exception:
        return None
    return _follow_visible(devices)


def visible_gpu_names() -> list[str] | None:
    """Names of the GPUs this process may use, in CUDA order (see :func:`visible_devices`)."""
    devices = visible_devices()
    return None if devices is None else [name for name, _ in devices]


def cuda_device_uuid(index: int) -> str | None:
    """UUID of CUDA device ``index`` (CUDA's numbering, after CUDA_VISIBLE_DEVICES), NVML's spelling.

    From torch when it has CUDA (exact whatever CUDA_DEVICE_ORDER says; initialises CUDA), else from
    CUDA_VISIBLE_DEVICES over NVML's list (exact when CUDA orders GPUs as NVML does: PCI order, the
    rule for identical GPUs). None when neither can say.
    """
    try:
        import torch

        if torch.cuda.is_available():
            return _nvml_uuid(str(torch.cuda.get_device_properties(index).uuid))
    except Exception:  # no torch, or torch cannot reach the device: fall back to NVML's list
        pass
    devices = visible_devices()
    if devices is None or not 0 <= index < len(devices):
        return None
    return _nvml_uuid(devices[index][1])


class DeviceReader:
    """An NVML session held open on one CUDA device: its busy % and memory in use, read cheaply
    and often (a sampler thread). ``DeviceReader.open(index)`` is None without NVML or when the
    device cannot be found."""

    def __init__(self, nv: Any, handle: Any, uuid: str) -> None:
        self._nv, self._handle, self.uuid = nv, handle, uuid

    @classmethod
    def open(cls, cuda_index: int) -> DeviceReader | None:
        uuid = cuda_device_uuid(cuda_index)
        if uuid is None:
            return None
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception:
            return None
        try:
            return cls(pynvml, pynvml.nvmlDeviceGetHandleByUUID(uuid), uuid)
        except Exception:
            pynvml.nvmlShutdown()
            return None

    def read(self) -> tuple[float, float] | None:
        """``(busy %, memory used in GiB)`` (all processes on the device), or None if NVML fails."""
        try:
            util = self._nv.nvmlDeviceGetUtilizationRates(self._handle).gpu
            mem = self._nv.nvmlDeviceGetMemoryInfo(self._handle).used / 2**30
            return float(util), float(mem)
        except Exception:
            return None

    def close(self) -> None:
        try:
            self._nv.nvmlShutdown()
        except Exception:
            pass


def pair_link(uuid_a: str, uuid_b: str) -> dict[str, Any] | None:
    """How two GPUs (by CUDA UUID) are linked: NVLink or a PCIe path, as the NCCL_P2P_LEVEL it needs.

    ``{"link": "NVLink" | "PCIe", "nccl_level": "NVL" | "PIX" | "PXB" | "PHB" | "SYS",
    "driver_p2p_read": bool | None}``
    """
    try:
        with _session() as nv:
            a, b = (nv.nvmlDeviceGetHandleByUUID(_nvml_uuid(u)) for u in (uuid_a, uuid_b))
            nvlink = _p2p_ok(nv, a, b, nv.NVML_P2P_CAPS_INDEX_NVLINK)
            read = _p2p_ok(nv, a, b, nv.NVML_P2P_CAPS_INDEX_READ)
            if nvlink:
                return {"link": "NVLink", "nccl_level": "NVL", "driver_p2p_read": read}
            ancestor = int(nv.nvmlDeviceGetTopologyCommonAncestor(a, b))
            return {"link": "PCIe", "nccl_level": _TOPOLOGY_TO_NCCL.get(ancestor, "SYS"), "driver_p2p_read": read}
    except Exception:
        return None


def _p2p_ok(nv: Any, a: Any, b: Any, index: int) -> bool | None:
    try:
        return int(nv.nvmlDeviceGetP2PStatus(a, b, index)) == int(nv.NVML_P2P_STATUS_OK)
    except Exception:
        return None
