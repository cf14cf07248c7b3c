"""Validation metrics over every DDP rank: gather each metric's state, merge, compute once.

Why: each rank validates its own share of the samples. Logging per-rank results with
``sync_dist=True`` averages them, which is not the metric of the whole validation set: an AP
(MapTR, SparseDrive) ranks every prediction of the epoch by confidence, and a mean of per-rank means
(minADE) weighs a rank that saw fewer agents too much. A metric that can say what it accumulated
(``state()``) and become the union of such states (``merge(states)``) is merged here on every rank,
so every rank computes the same, global value.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence

import torch.distributed as dist

from drivebench.dist import gather_objects


class MergeableMetric(Protocol):
    def state(self) -> Any:
        """What this process accumulated, picklable, on the host."""

    def merge(self, states: Sequence[Any]) -> None:
        """Become the union of ``states`` (one per rank, this rank's included)."""


def distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def merge_across_ranks(metrics: Sequence[MergeableMetric]) -> bool:
    """Merge ``metrics`` over all ranks in place; True when that happened (a multi-rank run with
    metrics to merge), False when the caller should fall back to averaging per-rank values."""
    if not metrics or not distributed():
        return False
    for metric in metrics:
        metric.merge(gather_objects(metric.state()))
    return True
