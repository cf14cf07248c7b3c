"""One LightningDataModule for every model: a data source, the model's transform and collate, the
loader knobs of the accel preset, and (through :class:`DeviceTransferDataModule`) the copy to the
device and the device transform.

Why generic: what differs between models is the per-sample transform and the collate (given by
the model config) and the dataset (given by the data config); the loader knobs, the seeded sample
order and the shared-memory cache are the same mechanism everywhere.
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from drivebench.accel.settings import AccelSettings
from drivebench.accel.shm_cache import CacheDoesNotFit, SharedSampleCache
from drivebench.accel.threads import ThreadBudget, limit_threads
from drivebench.data.device_prefetch import DevicePrefetchLoader
from drivebench.data.device_transfer import DeviceTransform, DeviceTransferDataModule
from drivebench.data.epoch_stream import EpochStream
from drivebench.data.sampling import EpochBatchSampler, RandomBatchSampler
from drivebench.errors import ConfigError
from drivebench.locks import exclusive_lock
from drivebench.signals import leave_stop_signals_to_the_parent
from drivebench.start_method import worker_context

log = logging.getLogger(__name__)


class DataSource(Protocol):
    """What a dataset family provides (``drivebench.data.sources``)."""

    name: str

    def prepare(self, workers: int, progress: bool) -> None:
        """Make the data exist on disk (generate the embedded set) and run one-time preprocessing."""

    def dataset(self, split: str, transform: Any, accel: AccelSettings, train: bool, progress: bool) -> Dataset:
        """The torch Dataset of one split, with the model's ``transform`` applied per sample."""

    def describe(self) -> dict[str, Any]:
        """Root, size, counts, preprocessing stats: for the run summary."""


@contextlib.contextmanager
def _prepare_lock(cache_dir: Any) -> Iterator[None]:
    """An exclusive file lock in the cache directory (no-op without one)."""
    if cache_dir is None:
        yield
        return
    with exclusive_lock(Path(cache_dir) / ".prepare.lock"):
        yield


class WorkerInit:
    """``worker_init_fn`` of every loader: numpy's seed, the worker's threads from the thread budget, and stop
    signals left to the training process (``signals.leave_stop_signals_to_the_parent``).

    numpy's global RNG is otherwise identical in every forked worker (per-sample randomness in our
    datasets comes from (seed, epoch, index) and never from these global states). ``threads``:
    torch intra-op / inter-op and BLAS / OpenMP threads of the worker (None: PyTorch's defaults,
    i.e. torch's DataLoader sets one intra-op thread and BLAS keeps one per core).
    """

    def __init__(self, threads: int | None = None) -> None:
        self.threads = threads

    def __call__(self, worker_id: int) -> None:
        np.random.seed(torch.initial_seed() % 2**32)
        limit_threads(self.threads)
        leave_stop_signals_to_the_parent()  # a signal to the process group stops training at a step boundary


class DriveDataModule(DeviceTransferDataModule):
    """Args:
        source: the data source (see :class:`DataSource`).
        transform: per-sample model transform (runs in the loader workers).
        collate_fn: the model's batch collation.
        batch_size / val_batch_size: per device.
        accel: resolved accel knobs (loader kwargs, shared-memory cache, preprocessing pool).
        seed: seeds the training sample order (so it is the same for any num_workers).
        train_split / val_split: split names of the source.
        progress: show progress bars for generation, preprocessing and caching.
        batch_sampler: optional factory ``(dataset, batch_size, num_replicas, rank, seed) ->
            EpochBatchSampler`` for models that need special batching (streaming sequences);
            default: :class:`RandomBatchSampler`.
        device_transform: the batch-level transform run on the device after the copy (the camera
            pipelines' GPU decode and normalisation, mmdet3d's data_preprocessor); see
            :class:`DeviceTransferDataModule`.
        threads: the run's thread budget: each loader worker starts with its ``worker_threads``
            (None: PyTorch's defaults).
    """

    def __init__(
        self,
        source: DataSource,
        transform: Callable[[Any], Any] | None,
        collate_fn: Callable[[list[Any]], Any] | None,
        batch_size: int,
        val_batch_size: int,
        accel: AccelSettings,
        seed: int = 0,
        train_split: str = "train",
        val_split: str = "val",
        progress: bool = True,
        batch_sampler: Callable[..., EpochBatchSampler] | None = None,
        device_transform: DeviceTransform | None = None,
        threads: ThreadBudget | None = None,
    ) -> None:
        super().__init__(device_transform)
        self.source = source
        self.transform = transform
        self.collate_fn = collate_fn
        self.batch_size = batch_size
        self.val_batch_size = val_batch_size
        self.accel = accel
        self.seed = seed
        self.train_split = train_split
        self.val_split = val_split
        self.progress = progress
        self.train_set: Dataset | None = None
        self.val_set: Dataset | None = None
        self.cache_info: dict[str, Any] = {"enabled": accel.shm_cache}
        self.batch_sampler_factory = batch_sampler
        self.worker_init = WorkerInit(threads.worker_threads if threads is not None else None)
        self._streams: list[weakref.ref] = []  # EpochStreams handed out; their workers stop at teardown
        self.hand_over_streams = False  # accel=auto's trial: teardown leaves them running for the next candidate
        self._adopted: EpochStream | None = None
        self.worker_start_method: str | None = None  # how the last loader built started its workers (summary data.)

    def prepare_data(self) -> None:
        # ranks started together (torchrun) must not generate the embedded set concurrently
        with _prepare_lock(getattr(self.source, "cache_dir", None)):
            self.source.prepare(workers=self.accel.preprocess_workers, progress=self.progress)

    def teardown(self, stage: str | None = None) -> None:
        """Stop the workers of the training streams (Lightning shuts down only DataLoaders' own), unless
        ``hand_over_streams``: then they keep running until :meth:`detach_train_stream` or a later teardown."""
        if self.hand_over_streams:
            return
        if self._adopted is not None:  # adopted but never iterated: its workers stop here too
            self._adopted.close()
            self._adopted = None
        for ref in self._streams:
            stream = ref()
            if stream is not None:
                stream.close()
        self._streams = []

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is None:
            self.train_set = self._build(self.train_split, train=True)
        if self.val_set is None:
            self.val_set = self._build(self.val_split, train=False)

    def _build(self, split: str, train: bool) -> Dataset:
        dataset = self.source.dataset(split, self.transform, accel=self.accel, train=train, progress=self.progress)
        if not (train and self.accel.shm_cache and hasattr(dataset, "load_raw")):
            if train and self.accel.shm_cache and not hasattr(self.transform, "cache_stats"):
                self.cache_info.update(enabled=False, reason="the dataset has no raw-sample hook (load_raw)")
            return dataset
        try:
            cached = SharedSampleCache(dataset, self.accel.shm_cache_max_gb * 2**30, progress=self.progress,
                                       desc=f"shm cache ({split})")
        except CacheDoesNotFit as err:
            log.warning("shared-memory cache disabled: %s", err)
            self.cache_info.update(enabled=False, reason=str(err))
            return dataset
        self.cache_info["cache"] = cached
        return cached

    def cache_stats(self) -> dict[str, Any]:
        info = {k: v for k, v in self.cache_info.items() if k != "cache"}
        cache = self.cache_info.get("cache")
        if cache is not None:
            info.update(cache.stats().to_dict())
        elif hasattr(self.transform, "cache_stats"):  # camera pipelines cache decoded images themselves
            info = self.transform.cache_stats()
        return info

    def _replicas(self) -> tuple[int, int]:
        trainer = getattr(self, "trainer", None)
        if trainer is None:
            return 1, 0
        return int(trainer.world_size), int(trainer.global_rank)

    def make_batch_sampler(self, dataset: Dataset, shuffle: bool = True) -> EpochBatchSampler:
        replicas, rank = self._replicas()
        if self.batch_sampler_factory is not None:
            return self.batch_sampler_factory(dataset=dataset, batch_size=self.batch_size, num_replicas=replicas,
                                              rank=rank, seed=self.seed)
        return RandomBatchSampler(len(dataset), self.batch_size, shuffle=shuffle, drop_last=True,
                                  num_replicas=replicas, rank=rank, seed=self.seed)

    def train_dataloader(self, device_prefetch: bool = True) -> EpochStream | DevicePrefetchLoader:
        """The training loader, a stateful one (Lightning saves its position in checkpoints and hands
        it back on resume); with ``accel.device_prefetch`` inside a trainer on a GPU, wrapped so that
        batches arrive on the device already transformed (``device_prefetch=False``: never)."""
        loader = self._train_loader()
        trainer = getattr(self, "trainer", None)
        if not (device_prefetch and self.accel.device_prefetch and trainer is not None):
            return loader
        device = trainer.strategy.root_device
        if device.type != "cuda":
            return loader
        return DevicePrefetchLoader(loader, device, self.move_batch, self.device_transform)

    def adopt_train_stream(self, stream: EpochStream) -> None:
        """Serve the next training loader from ``stream``: another datamodule's live stream over the same data
        with the same loader settings (accel=auto's candidates), rewound to its first batch. Its persistent
        workers are not started again: with many workers beside a large process that start costs seconds."""
        stream.load_state_dict({"epoch": 0, "batches_done": 0})
        self._adopted = stream

    def detach_train_stream(self) -> EpochStream | None:
        """The newest live training stream, which teardown will then leave running (the caller owns it)."""
        while self._streams:
            stream = self._streams.pop()()
            if stream is not None:
                stream.hold_workers = False  # its new owner stops it with close(), or a datamodule adopts it
                return stream
        return None

    def _train_loader(self) -> EpochStream:
        assert self.train_set is not None, "setup() first"
        if self._adopted is not None:
            stream, self._adopted = self._adopted, None
            stream.hold_workers = self.hand_over_streams
            self._streams.append(weakref.ref(stream))
            return stream
        sampler = self.make_batch_sampler(self.train_set)
        if not sampler.plan(0):
            replicas, _ = self._replicas()
            raise ConfigError(
                f"model.batch_size={self.batch_size} x {replicas} rank(s) is more than the {len(self.train_set)} "
                f"samples of the training split: not one batch per epoch. Lower model.batch_size or use more "
                f"data (data.size / data.root)")
        keyed = bool(getattr(self.train_set, "accepts_sample_keys", False))
        stream = EpochStream(sampler, self._loader_over, keyed=keyed, across_epochs=self.accel.prefetch_across_epochs)
        stream.hold_workers = self.hand_over_streams
        self._streams.append(weakref.ref(stream))
        return stream

    def _loader_over(self, batch_sampler: Any) -> DataLoader:
        return DataLoader(
            self.train_set,
            batch_sampler=batch_sampler,
            collate_fn=self.collate_fn,
            worker_init_fn=self.worker_init,
            # its own generator: starting an iterator draws a worker base seed, which must not come
            # from the global RNG (a resumed run restores that state, then starts a new iterator)
            generator=torch.Generator().manual_seed(self.seed),
            **self._loader_kwargs(),
        )

    def _loader_kwargs(self) -> dict[str, Any]:
        """accel's loader keywords, and the start method that is safe for workers forked now (start_method.py)."""
        kwargs = self.accel.loader_kwargs()
        if kwargs["num_workers"] > 0:
            datasets = {type(d).__module__ for d in (self.train_set, self.val_set) if d is not None}
            kwargs["multiprocessing_context"] = worker_context(preload=[__name__, *sorted(datasets)])
            self.worker_start_method = kwargs["multiprocessing_context"].get_start_method()
        return kwargs

    def _in_fit(self) -> bool:
        trainer = getattr(self, "trainer", None)
        return trainer is not None and trainer.state.fn == "fit"

    def val_dataloader(self) -> DataLoader:
        assert self.val_set is not None, "setup() first"
        kwargs = self._loader_kwargs()
        # a benchmark validates once, after its fit (its own Trainer); a fit that validates every epoch (trainer=full)
        # would fork the workers again for each validation: there they persist as accel.persistent_workers says
        kwargs["persistent_workers"] = bool(kwargs.get("persistent_workers")) and self._in_fit()
        kwargs.pop("prefetch_factor", None)
        replicas, rank = self._replicas()
        if self.batch_sampler_factory is not None:  # e.g. streaming sequences: keep them in order
            sampler = self.batch_sampler_factory(dataset=self.val_set, batch_size=self.val_batch_size,
                                                 num_replicas=replicas, rank=rank, seed=self.seed, shuffle=False,
                                                 drop_last=False, fit_streams=True,
                                                 batch_size_key="model.val_batch_size")
        else:
            sampler = RandomBatchSampler(len(self.val_set), self.val_batch_size, shuffle=False, drop_last=False,
                                         num_replicas=replicas, rank=rank, seed=self.seed)
        return DataLoader(self.val_set, batch_sampler=sampler, collate_fn=self.collate_fn,
                          worker_init_fn=self.worker_init, **kwargs)
