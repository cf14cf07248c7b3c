"""Per-stage time of a pipeline (like mmdet3d's DatasetBenchmark): where a sample's time goes."""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Iterable

from drivebench.data.transforms.dataset import NuScenesDataset


def stage_times(dataset: NuScenesDataset, indices: Iterable[int], warmup: int = 1, clock: str = "cpu") -> dict[str, float]:
    """Mean milliseconds per sample of each transform (by class name, in pipeline order), plus
    ``total``. ``clock``: "cpu" (process CPU time: robust on a shared machine; counts every thread
    of the process) or "wall". The first ``warmup`` samples run uncounted (lazy loads, caches)."""
    now = {"cpu": time.process_time, "wall": time.perf_counter}[clock]
    totals: dict[str, float] = defaultdict(float)
    order: list[str] = []
    counted = 0
    for n, i in enumerate(indices):
        results = dataset.results_for(i)
        t_all = now()
        for t in dataset.pipeline:
            name = type(t).__name__
            t0 = now()
            results = t(results)
            if n >= warmup:
                if name not in order:
                    order.append(name)
                totals[name] += now() - t0
        if n >= warmup:
            totals["total"] += now() - t_all
            counted += 1
    if counted == 0:
        raise ValueError("stage_times needs more indices than warmup samples")
    return {name: 1e3 * totals[name] / counted for name in [*order, "total"]}
