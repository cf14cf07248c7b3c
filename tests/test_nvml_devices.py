"""The NVML device a run reads is its own CUDA device, found by UUID (NVML ignores CUDA_VISIBLE_DEVICES).

pynvml is replaced by a fabricated driver with four GPUs, each with its own busy %, so reading the
wrong one shows in the sampled figure.
"""

from __future__ import annotations

import sys
import time
import types

import pytest
import torch

from drivebench.hardware import nvml
from drivebench.perf.system import SystemMonitor

# (name, UUID, busy %) in NVML (PCI) order
GPUS = [("NVIDIA H200", "GPU-aaaa0000-0000", 10), ("NVIDIA H200", "GPU-bbbb1111-1111", 20),
        ("NVIDIA H200", "GPU-cccc2222-2222", 30), ("NVIDIA H200", "GPU-dddd3333-3333", 40)]


class FakeNVML(types.ModuleType):
    """The pynvml calls drivebench makes, over ``GPUS``; counts sessions to check they are closed."""

    def __init__(self) -> None:
        super().__init__("pynvml")
        self.sessions = 0

    def nvmlInit(self) -> None:
        self.sessions += 1

    def nvmlShutdown(self) -> None:
        self.sessions -= 1

    def nvmlDeviceGetCount(self) -> int:
        return len(GPUS)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> int:
        return [u for _, u, _ in GPUS].index(uuid)  # ValueError (NVML: NotFound) for an unknown UUID

    def nvmlDeviceGetName(self, handle: int) -> bytes:
        return GPUS[handle][0].encode()

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return GPUS[handle][1]

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> types.SimpleNamespace:
        return types.SimpleNamespace(gpu=GPUS[handle][2], memory=0)

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> types.SimpleNamespace:
        return types.SimpleNamespace(used=(handle + 1) * 2**30)


@pytest.fixture
def fake_nvml(monkeypatch):
    fake = FakeNVML()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the NVML route, also on a GPU machine
    return fake


def _first_sample(device_index: int):
    monitor = SystemMonitor(device_index, interval=0.01)
    monitor.start()
    try:
        deadline = time.monotonic() + 10
        while monitor.latest() is None and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        monitor.stop()
    assert monitor.latest() is not None, "the monitor took no sample"
    return monitor.latest()


def test_a_pinned_run_reads_its_own_gpu_not_the_nvml_index(fake_nvml, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    sample = _first_sample(1)  # cuda:1 is the machine's fourth GPU; NVML index 1 is the second
    assert (sample.gpu_util_pct, sample.gpu_mem_gb) == (40.0, 4.0)
    assert fake_nvml.sessions == 0  # stop() closed the session it opened


def test_uuid_entries_in_cuda_visible_devices_are_followed(fake_nvml, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-cccc,GPU-aaaa")  # unique prefixes, as CUDA accepts
    assert nvml.cuda_device_uuid(0) == "GPU-cccc2222-2222"
    assert nvml.visible_gpu_names() == ["NVIDIA H200", "NVIDIA H200"]
    assert _first_sample(1).gpu_util_pct == 10.0


def test_torch_uuid_wins_where_cuda_orders_gpus_otherwise(fake_nvml, monkeypatch):
    # CUDA_DEVICE_ORDER=FASTEST_FIRST can number GPUs unlike NVML; torch's UUID is exact either way
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: types.SimpleNamespace(uuid="bbbb1111-1111" if i == 0 else "aaaa0000-0000"))
    assert _first_sample(0).gpu_util_pct == 20.0


def test_unknown_device_or_no_nvml_leaves_the_gpu_columns_empty(fake_nvml, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    assert nvml.cuda_device_uuid(1) is None  # only one GPU is visible
    sample = _first_sample(1)
    assert (sample.gpu_util_pct, sample.gpu_mem_gb) == (None, None)
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails: no NVML library
    assert nvml.DeviceReader.open(0) is None and nvml.visible_devices() is None
    assert _first_sample(0).gpu_util_pct is None
