"""The ceiling: the same model stepping on one batch that already sits on the device, no loader.

Real throughput divided by ceiling throughput is the run's efficiency: how much of what the model
could do on this machine the input pipeline lets it do.
"""

from __future__ import annotations

from typing import Any, Iterator


class ResidentBatch:
    """One host batch; moved to the device (and through device-side preprocessing) only once."""

    def __init__(self, host_batch: Any) -> None:
        self.host = host_batch
        self.device_batch: Any = None
        self.device: Any = None


class ResidentBatchLoader:
    """An iterable of ``steps`` references to the same :class:`ResidentBatch`."""

    def __init__(self, batch: ResidentBatch, steps: int) -> None:
        self.batch = batch
        self.steps = steps

    def __len__(self) -> int:
        return self.steps

    def __iter__(self) -> Iterator[ResidentBatch]:
        for _ in range(self.steps):
            yield self.batch
