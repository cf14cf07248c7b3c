"""Batch samplers that are deterministic per (seed, epoch), split across DDP ranks, and resumable.

Why our own: Lightning's default wraps a sampler in a DistributedSampler and cannot resume in the
middle of an epoch. Here the datamodule owns sampling in every mode (``use_distributed_sampler``
is off): the order of an epoch depends only on ``seed`` and the epoch, never on ``num_workers``,
so accel knobs that move work around cannot change what the model sees; and an epoch's plan can be
started after its first k batches (:class:`ContinuousBatches` ``start``), which is how the stateful
training loader (``drivebench.data.epoch_stream``) resumes mid-epoch.
"""

from __future__ import annotations

from typing import Any, Iterator, NamedTuple

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
        self.sampler = _EpochProxy(self)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def plan(self, epoch: int) -> list[list[int]]:
        raise NotImplementedError

    def __iter__(self) -> Iterator[list[int]]:
        yield from self.plan(self.epoch)

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


class SampleKey(NamedTuple):
    """What the training loader hands a dataset: the sample index, the epoch it is drawn for (which
    seeds the sample's augmentation) and, for streaming samplers, whether its previous frame was
    in the stream. Why the epoch travels with the index: loader workers hold their own copy of the
    dataset, so an epoch set on the main process's copy never reaches them, and with batches
    prefetched across an epoch boundary two epochs are in flight at once."""

    index: int
    epoch: int
    prev_exists: bool = False


def sample_key(item: Any, epoch: int) -> SampleKey:
    """``item`` as a sampler yields it (an index or an ``(index, prev_exists)`` pair) -> a key."""
    if isinstance(item, SampleKey):
        return item
    if isinstance(item, tuple):
        index, prev_exists = item
        return SampleKey(int(index), int(epoch), bool(prev_exists))
    return SampleKey(int(item), int(epoch))


def keyed_batch(batch: list[Any], epoch: int) -> list[SampleKey]:
    """A batch as a sampler yields it, each item keyed with ``epoch``."""
    return [sample_key(item, epoch) for item in batch]


def unpack_key(item: Any) -> tuple[int, int | None, bool]:
    """(index, epoch or None, prev_exists) from whatever a dataset's ``__getitem__`` received."""
    if isinstance(item, SampleKey):
        return item.index, item.epoch, item.prev_exists
    if isinstance(item, tuple):
        index, prev_exists = item
        return int(index), None, bool(prev_exists)
    return int(item), None, False


class ContinuousBatches(Sampler[list[SampleKey]]):
    """Epoch after epoch of ``sampler``'s batches (``epochs`` of them, or without end), starting at
    ``start`` = (epoch, batches to skip in it). The same batches, in the same order, as iterating the
    sampler epoch by epoch; the training loader's batch sampler
    (:class:`drivebench.data.epoch_stream.EpochStream`)."""

    def __init__(self, sampler: EpochBatchSampler, start: tuple[int, int] = (0, 0), keyed: bool = True,
                 epochs: int | None = None) -> None:
        self.batches = sampler
        self.start = start
        self.keyed = keyed  # False: the sampler's items as they are (datasets that take plain indices)
        self.epochs = epochs  # None: without end; 1: only the start epoch's (remaining) batches

    def __iter__(self) -> Iterator[list[SampleKey]]:
        epoch, skip = self.start
        last = None if self.epochs is None else epoch + self.epochs - 1
        while last is None or epoch <= last:
            plan = self.batches.plan(epoch)
            if not plan:
                raise ValueError(f"epoch {epoch} has no batches for this rank: the dataset is smaller than one "
                                 "batch per rank; lower the batch size or add data")
            for batch in plan[skip:]:
                yield keyed_batch(batch, epoch) if self.keyed else batch
            epoch, skip = epoch + 1, 0
