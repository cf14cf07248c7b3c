"""A camera pipeline made deliberately slow (or broken in loader workers), for the accel=auto tests.

It wraps the model's real ``CameraPipeline``: every sample goes through the real pipeline and then
through one more step that sleeps (a loader bound by I/O or decode), or raises when it runs inside a
DataLoader worker (a transform that cannot run there, so every ``num_workers > 0`` candidate fails).
"""

from __future__ import annotations

import time
from typing import Any

from torch.utils.data import get_worker_info


class _Sleep:
    def __init__(self, sleep_s: float, fail_in_workers: bool) -> None:
        self.sleep_s = sleep_s
        self.fail_in_workers = fail_in_workers

    def __call__(self, results: dict) -> dict:
        if self.fail_in_workers and get_worker_info() is not None:
            raise RuntimeError("slow_loader: this transform cannot run in a loader worker")
        time.sleep(self.sleep_s)
        return results


class SlowCameraPipeline:
    """``inner`` (a CameraPipeline) followed by a step that sleeps ``sleep_s`` per sample."""

    def __init__(self, inner: Any, sleep_s: float = 0.0, fail_in_workers: bool = False) -> None:
        self.inner = inner
        self.step = _Sleep(sleep_s, fail_in_workers)

    def build(self, *args: Any, **kwargs: Any) -> list:
        return [*self.inner.build(*args, **kwargs), self.step]

    def __getattr__(self, name: str) -> Any:  # device_transform_for, cache_stats, stats: the real pipeline's
        if name in ("inner", "step"):
            raise AttributeError(name)
        return getattr(self.inner, name)
