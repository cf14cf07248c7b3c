"""Streaming (sequence-grouped) batch sampling for temporal models (SparseDrive, Sparse4D).

Why: SparseDrive carries instances from one training step to the next per batch slot, so slot
``j`` of consecutive batches must hold consecutive frames of one driving sequence (upstream
``GroupInBatchSampler``). This sampler gives every slot of every DDP rank its own stream of whole
sequences, in frame order.

Plan of an epoch (deterministic in ``seed`` and the epoch):
1. sequences are ordered by a permutation of ``seed + epoch`` (or by id without ``shuffle``);
2. they are dealt, in that order, to the ``num_replicas * batch_size`` global slots, each to the
   slot whose stream is currently shortest (lowest slot on ties), so streams end up balanced; a
   sequence belongs to exactly one slot, hence to exactly one rank;
3. every slot yields one frame per batch. With ``drop_last`` all streams are cut to the shortest
   one (the tails of the longest streams are skipped this epoch); without it the shorter streams
   continue with sequences replayed from the start of their own list, so every sample is seen at
   least once. Either way every rank yields the same number of batches.

How the data side sets ``batch["prev_exists"]`` (docs/batch-contract.md): for slot ``j``, True iff
the previous batch of the same loader had, in slot ``j``, the previous key frame of the same
sequence (``prev_exists_for``). The DataLoader asks the sampler in the main process but builds
samples in workers, which see only indices; so pass ``yield_prev_exists=True`` and the sampler
yields ``(index, prev_exists)`` pairs that the dataset's ``__getitem__`` unpacks into the sample.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from drivebench.data.sampling import EpochBatchSampler
from drivebench.errors import ConfigError


def prev_exists_for(batch_indices: Sequence[int], previous_batch_indices: Sequence[int] | None,
                    sequence_ids: Sequence[int], frame_idx: Sequence[int], max_frame_gap: int = 1) -> list[bool]:
    """Per slot: does the previous batch's sample in this slot precede this one in the same sequence?

    True iff same sequence and ``0 < frame_idx[cur] - frame_idx[prev] <= max_frame_gap`` (1: the
    previous key frame, as the batch contract defines ``prev_exists``).
    """
    if previous_batch_indices is None:
        return [False] * len(batch_indices)
    if len(previous_batch_indices) != len(batch_indices):
        return [False] * len(batch_indices)
    out = []
    for cur, prev in zip(batch_indices, previous_batch_indices):
        gap = int(frame_idx[cur]) - int(frame_idx[prev])
        out.append(int(sequence_ids[cur]) == int(sequence_ids[prev]) and 0 < gap <= max_frame_gap)
    return out


def check_streams(batch_size: int, num_replicas: int, sequences: int | None, key: str = "model.batch_size",
                  split: str = "training split") -> None:
    """Refuse a batch whose streaming slots outnumber the split's sequences (each slot walks its own
    sequence, so ``batch_size x num_replicas`` slots need as many sequences); ``None``: unknown yet.

    Called before any work where the count is known from the config (the embedded sets' sizes) and
    again by the sampler once the infos are loaded (a real ``data.root``)."""
    slots = batch_size * num_replicas
    if sequences is None or sequences >= slots:
        return
    fits = sequences // num_replicas
    fix = f"lower {key} to {fits}" if fits else f"use at most {sequences} rank(s)"
    raise ConfigError(
        f"{key}={batch_size} x {num_replicas} rank(s) needs {slots} driving sequences (one per streaming batch slot) "
        f"but the {split} holds {sequences}: {fix}, or use more data (data.size=bench, data.root=...)")


class SequenceGroupedBatchSampler(EpochBatchSampler):
    """Batches whose slot ``j`` walks whole sequences in frame order (see module docstring).

    An ``EpochBatchSampler``: Lightning's ``set_epoch`` reaches it and the training loader can resume
    an epoch in the middle (the resumed slots then start mid-sequence with an empty model state, which
    ``prev_exists`` of the first resumed batch does not know: the model resets on resume anyway).

    Args:
        sequence_ids: sequence (scene) of every dataset index.
        frame_idx: position of every index inside its sequence (sorting key within a sequence).
        batch_size: samples per batch per rank (= streams per rank).
        num_replicas, rank: DDP world size and this process's rank.
        seed: base seed of the per-epoch sequence order (the same on every rank).
        shuffle: permute the sequence order every epoch.
        drop_last: cut every stream to the shortest (True) or replay sequences to the longest (False).
        yield_prev_exists: yield ``(index, prev_exists)`` pairs instead of bare indices.
        fit_streams: with fewer sequences than slots, use one slot per sequence (a smaller batch)
            instead of refusing: for validation, whose scores do not depend on how many sequences
            walk side by side (each slot still walks whole sequences in order).
        batch_size_key: the config key named when the sequences cannot feed the slots.
    """

    def __init__(self, sequence_ids: Sequence[int], frame_idx: Sequence[int], batch_size: int, num_replicas: int = 1,
                 rank: int = 0, seed: int = 0, shuffle: bool = True, drop_last: bool = True,
                 yield_prev_exists: bool = False, fit_streams: bool = False,
                 batch_size_key: str = "model.batch_size") -> None:
        if len(sequence_ids) != len(frame_idx):
            raise ValueError(f"{len(sequence_ids)} sequence ids for {len(frame_idx)} frame indices")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        super().__init__(num_replicas, rank, seed)
        self.sequence_ids = [int(s) for s in sequence_ids]
        self.frame_idx = [int(f) for f in frame_idx]
        self.batch_size, self.shuffle, self.drop_last = batch_size, shuffle, drop_last
        self.yield_prev_exists = yield_prev_exists
        self.batch_size_key = batch_size_key
        groups: dict[int, list[int]] = {}
        for index, seq in enumerate(self.sequence_ids):
            groups.setdefault(seq, []).append(index)
        self.sequences = {seq: sorted(idx, key=lambda i: self.frame_idx[i]) for seq, idx in groups.items()}
        if fit_streams and len(self.sequences) < batch_size * num_replicas:
            self.batch_size = max(1, len(self.sequences) // num_replicas)
        check_streams(self.batch_size, num_replicas, len(self.sequences), self.batch_size_key)
        self._plan_cache: tuple[int, list[list[int]]] | None = None

    def _sequence_order(self, epoch: int) -> list[int]:
        ids = sorted(self.sequences)
        if not self.shuffle:
            return ids
        g = torch.Generator().manual_seed(self.seed + epoch)
        return [ids[i] for i in torch.randperm(len(ids), generator=g).tolist()]

    def _streams(self, epoch: int) -> list[list[int]]:
        """Per global slot, the list of sequences it walks in ``epoch`` (cached per epoch)."""
        if self._plan_cache is not None and self._plan_cache[0] == epoch:
            return self._plan_cache[1]
        slots = self.batch_size * self.num_replicas
        streams: list[list[int]] = [[] for _ in range(slots)]
        lengths = [0] * slots
        for seq in self._sequence_order(epoch):
            j = min(range(slots), key=lambda s: (lengths[s], s))
            streams[j].append(seq)
            lengths[j] += len(self.sequences[seq])
        self._plan_cache = (epoch, streams)
        return streams

    def _num_batches(self, streams: list[list[int]]) -> int:
        lengths = [sum(len(self.sequences[s]) for s in stream) for stream in streams]
        return min(lengths) if self.drop_last else max(lengths)

    def _slot_frames(self, stream: list[int], count: int) -> list[int]:
        frames: list[int] = []
        k = 0
        while len(frames) < count:
            frames.extend(self.sequences[stream[k % len(stream)]])
            k += 1
        return frames[:count]

    def plan(self, epoch: int) -> list[list[Any]]:
        """This rank's batches of ``epoch``: slot j of batch k is the k-th frame of stream j."""
        streams = self._streams(epoch)
        count = self._num_batches(streams)
        mine = streams[self.rank * self.batch_size : (self.rank + 1) * self.batch_size]
        columns = [self._slot_frames(stream, count) for stream in mine]
        batches: list[list[Any]] = []
        previous: list[int] | None = None
        for step in range(count):
            batch = [column[step] for column in columns]
            if self.yield_prev_exists:
                flags = prev_exists_for(batch, previous, self.sequence_ids, self.frame_idx)
                batches.append(list(zip(batch, flags)))
            else:
                batches.append(batch)
            previous = batch
        return batches


def streaming_batch_sampler(dataset: Any, batch_size: int, num_replicas: int = 1, rank: int = 0, seed: int = 0,
                            yield_prev_exists: bool = True, **kwargs: Any) -> SequenceGroupedBatchSampler:
    """``DriveDataModule(batch_sampler=...)`` factory.

    Sequence ids and frame indices come from ``dataset.sequence_ids`` / ``dataset.frame_idx`` (one
    entry per sample index) or, failing those, from ``dataset.records`` (info dicts with
    ``sequence_id`` and ``frame_idx``, as ``NuScenesDataset``). Batches hold ``(index,
    prev_exists)`` pairs by default, which ``NuScenesDataset.__getitem__`` unpacks; ``kwargs`` go
    to the sampler.
    """
    if hasattr(dataset, "sequence_ids") and hasattr(dataset, "frame_idx"):
        sequence_ids, frame_idx = list(dataset.sequence_ids), list(dataset.frame_idx)
    elif hasattr(dataset, "records"):
        missing = [i for i, r in enumerate(dataset.records) if "sequence_id" not in r or "frame_idx" not in r]
        if missing:
            raise KeyError(f"{len(missing)} info records of {type(dataset).__name__} (first: index {missing[0]}) lack "
                           "sequence_id / frame_idx: rebuild the info index with sequence fields")
        sequence_ids = [int(r["sequence_id"]) for r in dataset.records]
        frame_idx = [int(r["frame_idx"]) for r in dataset.records]
    else:
        raise AttributeError(f"{type(dataset).__name__} has neither sequence_ids/frame_idx nor records: streaming "
                             "batches need the sequence id and the frame index of every sample")
    return SequenceGroupedBatchSampler(sequence_ids, frame_idx, batch_size, num_replicas, rank, seed,
                                       yield_prev_exists=yield_prev_exists, **kwargs)
