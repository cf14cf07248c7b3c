"""The time the training loop spends blocked in the data loader's ``next()``, and nothing else.

Why a profiler: Lightning fetches batch n+1 inside step n's ``next(data_fetcher)`` and wraps that
one call in ``profiler.start/stop("[_TrainingEpochLoop].train_dataloader_next")``. No callback
hook sits around it, so the gap between two steps also holds Lightning's bookkeeping and, above
all, the host waiting for the device when logged values are read back. Counting that gap as
"data wait" blamed the loader for the device's work (the ceiling, whose batch never leaves the
device, showed 19% "data wait" on MapTR). This profiler records only the loader call; the
rest of the gap is reported as loop overhead.
"""

from __future__ import annotations

import time

from lightning.pytorch.profilers import PassThroughProfiler

from drivebench.perf.spans import SPANS

LOADER_ACTION_SUFFIX = "train_dataloader_next"


class LoaderWaitProfiler(PassThroughProfiler):
    """A pass-through profiler that times only the train loader's ``next()`` into ``SPANS``."""

    def __init__(self) -> None:
        super().__init__()
        self._t0: float | None = None

    def start(self, action_name: str) -> None:
        if action_name.endswith(LOADER_ACTION_SUFFIX):
            self._t0 = time.perf_counter()

    def stop(self, action_name: str) -> None:
        if self._t0 is not None and action_name.endswith(LOADER_ACTION_SUFFIX):
            SPANS.add("loader_next", time.perf_counter() - self._t0)
            self._t0 = None
