"""Read-only NVML queries (driver, GPU names, how two GPUs are linked), without initialising CUDA.

Why NVML and not torch: these answers are needed before any CUDA context exists (the training
launcher reads the cached P2P verdict before it spawns its workers), and NVML knows the PCIe/NVLink
topology, which CUDA does not expose. Every function returns None where NVML is absent.
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


def visible_gpu_names() -> list[str] | None:
    """Names of the GPUs this process may use, in CUDA order, following CUDA_VISIBLE_DEVICES.

    None when NVML is absent or CUDA_VISIBLE_DEVICES uses a form this does not follow (MIG ids).
    """
    try:
        with _session() as nv:
            devices = []
            for i in range(nv.nvmlDeviceGetCount()):
                handle = nv.nvmlDeviceGetHandleByIndex(i)
                devices.append((_text(nv.nvmlDeviceGetName(handle)), _text(nv.nvmlDeviceGetUUID(handle))))
    except Exception:
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return [name for name, _ in devices]
    names: list[str] = []
    for token in (t.strip() for t in visible.split(",")):
        if token.isdigit() and int(token) < len(devices):
            names.append(devices[int(token)][0])
        elif token.startswith("GPU-"):
            match = [name for name, uuid in devices if uuid.startswith(token)]
            if len(match) != 1:
                break
            names.append(match[0])
        elif token.startswith("MIG-"):
            return None
        else:  # CUDA stops at the first entry it cannot use
            break
    return names


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


def _nvml_uuid(uuid: str) -> str:
    return uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"


def _p2p_ok(nv: Any, a: Any, b: Any, index: int) -> bool | None:
    try:
        return int(nv.nvmlDeviceGetP2PStatus(a, b, index)) == int(nv.NVML_P2P_STATUS_OK)
    except Exception:
        return None
