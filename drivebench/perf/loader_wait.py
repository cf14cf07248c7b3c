"""The time the training loop spends blocked in the data loader's ``next()``, and nothing else.

Why a profiler: Lightning fetches batch n+1 inside step n's ``next(data_fetcher)`` and wraps that
one call in ``profiler.start/stop("[_TrainingEpochLoop].train_dataloader_next")``. No callback
hook sits around it, so the gap between two steps also holds Lightning's bookkeeping and, above
all, the host waiting for the device when logged values are read back. Counting that gap as
"data wait" blamed the loader for the device's work (the ceiling, whose batch never leaves the
device, showed 19% "data wait" on MapTR). This profiler records only the loader call, into the
step clock its trainer's :class:`~drivebench.perf.callback.StepTimer` hands it; the rest of the gap
is reported as loop overhead. While ``torch.profiler`` records (``bench.profile``), the same call is
marked in its trace as ``drivebench/data_wait``, so the trace analysis can tell GPU idle time spent
waiting for data from the rest.
"""

from __future__ import annotations

import time

import torch
from lightning.pytorch.profilers import PassThroughProfiler

from drivebench.perf.clock import LOADER_NEXT, StepClock
from drivebench.perf.trace_analysis import DATA_WAIT_ANNOTATION

LOADER_ACTION_SUFFIX = "train_dataloader_next"


class LoaderWaitProfiler(PassThroughProfiler):
    """A pass-through profiler that times only the train loader's ``next()`` into its step clock."""

    def __init__(self) -> None:
        super().__init__()
        self._t0: float | None = None
        self._mark: torch.autograd.profiler.record_function | None = None
        self.step_clock = StepClock()

    def use_step_clock(self, clock: StepClock | None) -> None:
        self.step_clock = clock if clock is not None else StepClock()

    def start(self, action_name: str) -> None:
        if action_name.endswith(LOADER_ACTION_SUFFIX):
            if torch.autograd._profiler_enabled():  # only while torch.profiler records: free otherwise
                self._mark = torch.autograd.profiler.record_function(DATA_WAIT_ANNOTATION)
                self._mark.__enter__()
            self._t0 = time.perf_counter()

    def stop(self, action_name: str) -> None:
        if self._t0 is not None and action_name.endswith(LOADER_ACTION_SUFFIX):
            self.step_clock.add(LOADER_NEXT, time.perf_counter() - self._t0)
            self._t0 = None
            if self._mark is not None:
                self._mark.__exit__(None, None, None)
                self._mark = None
