"""Background sampler of GPU utilisation/memory (NVML) and CPU use of the trainer and its workers.

Why a thread: NVML utilisation is a rolling device counter and psutil CPU percentages are deltas
between calls; sampling them every ``interval`` seconds off the training thread costs the step
nothing and gives a series we can cut to the measured phase afterwards.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

import psutil

from drivebench.hardware.nvml import DeviceReader


@dataclass
class SystemSample:
    t: float                       # time.perf_counter() of the sample
    gpu_util_pct: float | None     # NVML: % of time a kernel was running on our device
    gpu_mem_gb: float | None       # NVML: memory used on our device (all processes)
    cpu_main_pct: float            # this process, % of one core
    cpu_workers_pct: float         # all child processes (loader workers), % of one core
    cpu_system_pct: float          # the whole machine, % of all cores
    run_queue: int | None = None   # runnable tasks on the machine now (Linux /proc/loadavg), ours included
    load_1m: float | None = None   # 1-minute load average (slow: it also remembers the minute before the run)


def read_run_queue() -> tuple[int | None, float | None]:
    """Runnable tasks and the 1-minute load: more runnable tasks than cores = oversubscribed."""
    try:
        with open("/proc/loadavg") as fh:
            fields = fh.read().split()
        # the reader itself is one of the running tasks
        return max(int(fields[3].split("/")[0]) - 1, 0), float(fields[0])
    except (OSError, ValueError, IndexError):
        try:
            return None, os.getloadavg()[0]
        except (OSError, AttributeError):
            return None, None


class SystemMonitor:
    """Samples in a daemon thread between ``start()`` and ``stop()``.

    ``device_index`` is the CUDA device (CUDA's numbering); NVML is asked for the same GPU by its
    UUID (:class:`~drivebench.hardware.nvml.DeviceReader`), since NVML ignores CUDA_VISIBLE_DEVICES.
    """

    def __init__(self, device_index: int | None, interval: float = 0.5) -> None:
        self.device_index = device_index
        self.interval = interval
        self.samples: list[SystemSample] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._gpu_reader: DeviceReader | None = None
        self._proc = psutil.Process(os.getpid())
        self._children: dict[int, psutil.Process] = {}

    def start(self) -> None:
        if self._thread is not None:
            return
        if self.device_index is not None and self._gpu_reader is None:
            # None without NVML (a driverless container): the GPU columns stay empty
            self._gpu_reader = DeviceReader.open(self.device_index)
        self._proc.cpu_percent(None)
        psutil.cpu_percent(None)
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="drivebench-sysmon", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(timeout=5)
        self._thread = None
        if self._gpu_reader is not None:
            self._gpu_reader.close()
            self._gpu_reader = None

    def latest(self) -> SystemSample | None:
        return self.samples[-1] if self.samples else None

    def window(self, t0: float, t1: float) -> list[SystemSample]:
        return [s for s in self.samples if t0 <= s.t <= t1]

    def _children_cpu(self) -> float:
        total = 0.0
        try:
            current = {p.pid: p for p in self._proc.children(recursive=True)}
        except psutil.Error:
            return 0.0
        for pid, proc in current.items():
            known = self._children.get(pid)
            if known is None:
                try:
                    proc.cpu_percent(None)  # first call primes the delta
                except psutil.Error:
                    continue
                self._children[pid] = proc
                continue
            try:
                total += known.cpu_percent(None)
            except psutil.Error:
                pass
        for pid in list(self._children):
            if pid not in current:
                del self._children[pid]
        return total

    def _gpu(self) -> tuple[float | None, float | None]:
        reading = self._gpu_reader.read() if self._gpu_reader is not None else None
        return reading if reading is not None else (None, None)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            gpu_util, gpu_mem = self._gpu()
            try:
                main = self._proc.cpu_percent(None)
            except psutil.Error:
                main = 0.0
            run_queue, load_1m = read_run_queue()
            self.samples.append(
                SystemSample(time.perf_counter(), gpu_util, gpu_mem, main, self._children_cpu(), psutil.cpu_percent(None),
                             run_queue, load_1m)
            )
