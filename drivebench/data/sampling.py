"""Batch samplers that are deterministic per (seed, epoch), split across DDP ranks, and resumable.

Why our own: Lightning's default wraps a sampler in a DistributedSampler and cannot resume in the
middle of an epoch. Here the datamodule owns sampling in every mode (``use_distributed_sampler``
is off): the order of an epoch depends only on ``seed`` and the epoch, never on ``num_workers``,
so accel knobs that move work around cannot change what the model sees; and ``skip_next(k)``
restarts an epoch after its first k batches, which is how ``resume`` continues mid-epoch.
"""

from __future__ import annotations

from typing import Iterator

import torch
from torch.utils.data import Sampler


class _EpochProxy:
    """Lightning calls ``dataloader.batch_sampler.sampler.set_epoch(e)`` at each epoch start."""

    def __init__(self, owner: "EpochBatchSampler") -> None:
        self._owner = owner

    def set_epoch(self, epoch: int) -> None:
        self._owner.set_epoch(epoch)


class EpochBatchSampler(Sampler[list[int]]):
    """Base class: subclasses implement :meth:`plan` (this rank's batches of one epoch)."""

    def __init__(self, num_replicas: int = 1, rank: int = 0, seed: int = 0) -> None:
        if num_replicas < 1 or not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} is not valid for {num_replicas} replicas")
        self.num_replicas = num_replicas
        self.rank = rank
        self.seed = seed
        self.epoch = 0
        self._skip = 0
        self.sampler = _EpochProxy(self)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def skip_next(self, batches: int) -> None:
        """The next iteration starts after ``batches`` batches of its epoch (resume)."""
        self._skip = max(int(batches), 0)

    def plan(self, epoch: int) -> list[list[int]]:
        raise NotImplementedError

    def __iter__(self) -> Iterator[list[int]]:
        batches = self.plan(self.epoch)
        skip, self._skip = self._skip, 0
        yield from batches[skip:]

    def __len__(self) -> int:
        return len(self.plan(self.epoch))


class RandomBatchSampler(EpochBatchSampler):
    """Shuffled (or sequential) batches over ``num_samples`` indices.

    Like DistributedSampler: one permutation per epoch from ``seed + epoch``, trimmed (drop_last)
    or padded by wrapping so every rank gets the same number of samples, rank r takes every
    ``num_replicas``-th index starting at r. Then consecutive indices form batches.
    """

    def __init__(self, num_samples: int, batch_size: int, shuffle: bool = True, drop_last: bool = True,
                 num_replicas: int = 1, rank: int = 0, seed: int = 0) -> None:
        super().__init__(num_replicas, rank, seed)
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.drop_last = drop_last
        self._cache: tuple[int, list[list[int]]] | None = None

    def plan(self, epoch: int) -> list[list[int]]:
        if self._cache is not None and self._cache[0] == epoch:
            return self._cache[1]
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed + epoch)
            order = torch.randperm(self.num_samples, generator=g).tolist()
        else:
            order = list(range(self.num_samples))
        per_rank = len(order) // self.num_replicas if self.drop_last else -(-len(order) // self.num_replicas)
        total = per_rank * self.num_replicas
        if total > len(order) and order:
            order = order + order[: total - len(order)]
        mine = order[:total][self.rank::self.num_replicas]
        n_batches = len(mine) // self.batch_size if self.drop_last else -(-len(mine) // self.batch_size)
        batches = [mine[i * self.batch_size:(i + 1) * self.batch_size] for i in range(n_batches)]
        self._cache = (epoch, batches)
        return batches
