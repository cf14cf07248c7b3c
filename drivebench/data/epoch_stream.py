"""The training loader: epochs of a seeded batch plan, resumable from Lightning's checkpoints, and
(``accel.prefetch_across_epochs``) fed by one DataLoader iterator over all epochs.

Resume: the stream is a stateful loader (``state_dict`` / ``load_state_dict``). Lightning's fit
loop puts its ``state_dict`` into every checkpoint (``loops.fit_loop.state_dict.combined_loader``)
and hands it back before the first resumed batch is drawn: ``{"epoch": e, "batches_done": k}``, the
next batch being batch k of epoch e (after an epoch's last batch: ``(e + 1, 0)``). The plan depends
on seed and epoch only, so the resumed stream draws exactly the batches the uninterrupted run drew
next. If Lightning then starts another epoch than the one the position is in (it ended that epoch
early, e.g. at a ``limit_train_batches`` smaller than the plan), that epoch starts at its beginning.

Why across epochs: a DataLoader stops handing out indices when its epoch's sampler is exhausted, so
the workers sit idle during the last steps of an epoch and the first batch of the next one costs a
whole worker's batch time (on the H200, MapTR's steps 49 and 97 waited 0.21 and 0.25 s for data, 3%
of a 100-step benchmark on the 192-sample set). With ``across_epochs`` one DataLoader iterates an
endless stream of epochs (:class:`ContinuousBatches`) and Lightning sees this object, whose iterator
ends after each epoch's batches while the workers carry on with the next epoch. Without it, every
epoch gets a DataLoader iterator of its own, as a plain DataLoader does. The batches and their order
are the same either way (each sample's augmentation depends on its :class:`SampleKey`), so the knob
moves work in time and changes no number.

Lightning's ``set_epoch`` reaches :attr:`sampler`. Each iteration starts its epoch from the
beginning (the first one: from the resume point); only when that is exactly where the stream stands
(the previous epoch ran to its end) do the prefetched batches carry over. Otherwise (a resume, an
epoch abandoned part-way, a wrapper that drew ahead from an iterator Lightning then dropped) the
stream restarts there, and an older iterator stops yielding. Iterating is lazy: the DataLoader
iterator starts at the first batch asked for, after Lightning has set the epoch.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Iterator

from torch.utils.data import DataLoader

from drivebench.data.sampling import ContinuousBatches, EpochBatchSampler


class _EpochRequest:
    """What Lightning calls ``set_epoch`` on (as ``dataloader.sampler``)."""

    def __init__(self, owner: "EpochStream") -> None:
        self._owner = weakref.ref(owner)  # no reference cycle: a dropped stream frees its workers at once

    def set_epoch(self, epoch: int) -> None:
        owner = self._owner()
        if owner is not None:
            owner.requested_epoch = int(epoch)


class EpochStream:
    """An iterable of one epoch's batches at a time; a stateful loader for Lightning (resume).

    Args:
        sampler: the epoch batch sampler (this rank's plan of each epoch).
        make_loader: builds the DataLoader for a given batch sampler (dataset, collate and the
            loader knobs are the caller's).
        start: (epoch, batches already done in it) where the stream begins (also set by
            :meth:`load_state_dict`).
        keyed: hand the dataset :class:`SampleKey` items (datasets with ``accepts_sample_keys``).
        across_epochs: one DataLoader iterator for all epochs (``accel.prefetch_across_epochs``);
            False: one per epoch.
    """

    def __init__(self, sampler: EpochBatchSampler, make_loader: Callable[[ContinuousBatches], DataLoader],
                 start: tuple[int, int] = (0, 0), keyed: bool = True, across_epochs: bool = True) -> None:
        self.plans = sampler
        self.across_epochs = across_epochs
        self.stream = ContinuousBatches(sampler, start, keyed=keyed, epochs=None if across_epochs else 1)
        self.loader = make_loader(self.stream)
        self.sampler = _EpochRequest(self)
        self.iterator_starts = 0  # 1 when one loader iterator served every epoch (across_epochs)
        self._batches: Iterator[Any] | None = None  # the DataLoader iterator (Lightning sees it as ``_iterator``)
        self.hold_workers = False  # accel=auto's trial: the workers outlive the fit, for the next candidate
        self._generation = 0  # bumped by every __iter__: an older epoch iterator stops yielding
        self._seek(int(start[0]), int(start[1]))

    @property
    def _iterator(self) -> Iterator[Any] | None:
        """What Lightning's loader reset shuts down at the end of a fit (and of a failed one): the DataLoader
        iterator, unless ``hold_workers`` hands the workers on (the datamodule's teardown stops them then)."""
        return None if self.hold_workers else self._batches

    @_iterator.setter
    def _iterator(self, value: Iterator[Any] | None) -> None:
        if not self.hold_workers:
            self._batches = value

    def _seek(self, epoch: int, batches_done: int) -> None:
        """The next iteration starts at batch ``batches_done`` of ``epoch`` (if that epoch is the one asked for)."""
        self.position = (epoch, batches_done)  # the next batch the stream yields
        self.requested_epoch: int | None = epoch
        self._resume = (epoch, batches_done)  # only the first epoch iterated skips, and only if it is this one
        self._batches = None  # a stream positioned anew does not carry prefetched batches over

    # ---- Lightning's stateful-loader interface -------------------------------------------------
    def state_dict(self) -> dict[str, int]:
        """Where the stream stands: the next batch is batch ``batches_done`` of ``epoch``."""
        return {"epoch": int(self.position[0]), "batches_done": int(self.position[1])}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue at a checkpoint's position (before the first resumed batch is drawn)."""
        self._seek(int(state["epoch"]), int(state["batches_done"]))

    @property
    def dataset(self) -> Any:
        return self.loader.dataset

    @property
    def batch_sampler(self) -> Any:
        return None

    def __len__(self) -> int:
        epoch = self.requested_epoch if self.requested_epoch is not None else self.position[0]
        return len(self.plans.plan(epoch))

    def _restart(self, epoch: int, skip: int) -> None:
        self.stream.start = (epoch, skip)
        self.position = (epoch, skip)
        self._batches = iter(self.loader)  # persistent workers are reused; stale batches are dropped
        self.iterator_starts += 1

    def __iter__(self) -> Iterator[Any]:
        # a generator: nothing here runs before the first batch is asked for, so an epoch Lightning
        # sets after creating the iterator (as it does on resume) is the one iterated
        self._generation += 1
        generation = self._generation
        epoch = self.requested_epoch if self.requested_epoch is not None else self.position[0]
        self.requested_epoch = None
        # like a DataLoader, every iteration starts its epoch at the beginning (or, the first time,
        # at the resume point); only an epoch that continues where the stream stands reuses it
        resume_epoch, resume_skip = self._resume
        target = (epoch, resume_skip if epoch == resume_epoch else 0)
        self._resume = (-1, 0)
        if self._batches is None or self.position != target or not self.across_epochs:
            self._restart(*target)
        n = len(self.plans.plan(epoch))
        if self.position == (epoch, n):  # resumed after an epoch's last batch: nothing left in it
            self.position = (epoch + 1, 0)
        while self.position[0] == epoch and generation == self._generation:
            batch = next(self._batches)
            done = self.position[1] + 1
            # moved on before the yield: Lightning stops asking after len(self) batches, so code
            # after the last yield may never run
            self.position = (epoch + 1, 0) if done >= n else (epoch, done)
            yield batch

    def close(self) -> None:
        """Stop the workers now (with persistent workers the DataLoader itself keeps its iterator,
        so dropping ours is not enough; Lightning does the same for its own loaders)."""
        iterator, self._batches = self._batches, None
        stop_workers(self.loader, iterator)


def stop_workers(loader: Any, iterator: Any = None) -> None:
    """Shut down ``iterator``'s loader workers and the one a persistent-workers DataLoader keeps.

    Left to interpreter exit, the join of many workers plus a pin-memory thread can hang (mmengine's
    runner at accel=max on the H200, part 11b: the exit watchdog had to end the process)."""
    for it in (iterator, getattr(loader, "_iterator", None)):
        shutdown = getattr(it, "_shutdown_workers", None)
        if callable(shutdown):
            shutdown()
    if getattr(loader, "_iterator", None) is not None:
        loader._iterator = None
