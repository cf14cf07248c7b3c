"""The step clock: marks and spans of the step in flight, written by what the step passes through.

Why an object handed around: Lightning has no callback hook between "the loader returned a batch"
and "the batch is on the device", nor around the loader's ``next()`` or a checkpoint write. The
parts that see those moments (the datamodule's batch-transfer hooks, the loader-wait profiler, the
checkpoint callback) record into one :class:`StepClock`. Its owner,
:class:`~drivebench.perf.callback.StepTimer`, hands it to them when its trainer is set up
(:class:`RecordsSteps`), takes it back at teardown, and reads and clears it once per step; all the
arithmetic is the timer's. Recording is a dict write; nothing here synchronises the device.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator, Protocol, runtime_checkable

import torch

FETCHED = "fetched"  # mark: the loader's batch reached the batch-transfer hooks
LOADER_NEXT = "loader_next"  # host time blocked in the train loader's next()
H2D = "h2d"  # span: the host-to-device copy
GPU_PREPROCESS = "gpu_preprocess"  # span: the device transform
CKPT = "ckpt"  # span: a checkpoint save inside the step interval


class StepClock:
    """Wall-clock marks and host/device-timed spans of the step in flight.

    A new clock is off: it records nothing until its owner turns it on (``enabled``), so a part that
    was never handed a timer's clock can keep a clock of its own and call it unconditionally.
    """

    def __init__(self) -> None:
        self.enabled = False
        self.use_cuda_events = False
        self.marks: dict[str, float] = {}
        self.durations: dict[str, float] = {}
        self.cuda_events: dict[str, tuple[torch.cuda.Event, torch.cuda.Event]] = {}

    def mark(self, name: str) -> None:
        if self.enabled:
            self.marks[name] = time.perf_counter()

    def add(self, name: str, seconds: float) -> None:
        """Add a host duration measured elsewhere (e.g. by the loader-wait profiler)."""
        if self.enabled:
            self.durations[name] = self.durations.get(name, 0.0) + seconds

    @contextmanager
    def span(self, name: str) -> Iterator[None]:
        """Time the enclosed block on the host and, on CUDA, on the device's current stream."""
        if not self.enabled:
            yield
            return
        start_ev = end_ev = None
        if self.use_cuda_events:
            start_ev = torch.cuda.Event(enable_timing=True)
            end_ev = torch.cuda.Event(enable_timing=True)
            start_ev.record()
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.durations[name] = self.durations.get(name, 0.0) + time.perf_counter() - t0
            if end_ev is not None and start_ev is not None:
                end_ev.record()
                self.cuda_events[name] = (start_ev, end_ev)

    def pop(self) -> tuple[dict[str, float], dict[str, float], dict[str, tuple]]:
        """Return and clear (marks, host durations, cuda event pairs) of the current step."""
        out = (self.marks, self.durations, self.cuda_events)
        self.marks, self.durations, self.cuda_events = {}, {}, {}
        return out


@runtime_checkable
class RecordsSteps(Protocol):
    """A part of a trainer that records into a step clock (the datamodule, the profiler, callbacks)."""

    def use_step_clock(self, clock: StepClock | None) -> None:
        """Record into ``clock`` from now on; ``None``: into a clock of one's own, which is off."""
