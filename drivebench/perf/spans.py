"""Timestamps marked inside Lightning's batch hooks, read back by the perf callback.

Why a module-level recorder: Lightning has no callback hook between "the loader returned a batch"
and "the batch is on the device"; the LightningModule's batch hooks see those moments, so they
mark them here, and ``perf.callback.StepTimer`` (which owns all the arithmetic) reads and clears
them once per step. Marking is a dict write; nothing here synchronises the device.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator

import torch


class StepSpans:
    """Wall-clock marks and device-timed spans for the step in flight."""

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


SPANS = StepSpans()
