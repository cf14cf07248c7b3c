"""``accel.device_prefetch``: batches reach the device (and are decoded there) ahead of the step.

Why: with ``device_transform=decode`` the training thread itself copied each batch to the GPU and
ran nvjpeg + the photometric kernels before the step could start (8 ms of host time per MapTR
step on the H200, and the step's kernels queued behind them). Here a background thread does the
copy and the device transform on its own CUDA stream, ``depth`` batches ahead; the training stream
waits on an event per batch (no host sync) and ``record_stream`` keeps the caching allocator from
recycling the batch's memory while the training stream still reads it. The pattern is NVIDIA's
"data prefetcher" (apex ImageNet example) with the decode moved into it.

The thread's host time per batch is reported in the summary (``data.device_prefetch``); it is off
the training thread's critical path, so the step timer's ``h2d``/``gpu_preprocess`` spans read ~0.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from typing import Any, Callable, Iterator

import torch

from drivebench.perf.stats import describe

READY_KEY = "_device_ready"  # set on prefetched batches: the datamodule must not transform them again
_END = object()


class _Failure:
    def __init__(self, error: BaseException) -> None:
        self.error = error


def _tensors(obj: Any) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v)


class DevicePrefetchLoader:
    """Wrap a DataLoader so that iterating it yields batches already on ``device`` and transformed.

    Lightning sees an iterable with ``len``, ``sampler``, ``batch_sampler`` and ``dataset`` (it sets
    the sampler's epoch through them) and, for a stateful loader (the training stream), its
    ``state_dict`` as of the last batch handed out: the thread draws ``depth`` batches ahead, so the
    loader's own position is ahead of the training loop's. Resuming and epochs behave as with the
    bare loader. Iterating is lazy (the thread starts at the first batch asked for, after Lightning
    set the epoch).
    """

    def __init__(self, loader: Any, device: torch.device, transfer: Callable[[Any, torch.device], Any],
                 transform: Callable[[Any], Any] | None, depth: int = 2) -> None:
        if depth < 1:
            raise ValueError(f"device prefetch depth must be >= 1, got {depth}")
        self.loader = loader
        self.device = torch.device(device)
        self.transfer = transfer
        self.transform = transform
        self.depth = depth
        self.host_s: list[tuple[float, float]] = []  # (transfer, transform) host seconds per batch
        self._active: _PrefetchIterator | None = None
        self._state: dict[str, Any] | None = None  # the loader's state after the last batch handed out

    def __len__(self) -> int:
        return len(self.loader)

    @property
    def sampler(self) -> Any:
        return getattr(self.loader, "sampler", None)

    @property
    def batch_sampler(self) -> Any:
        return getattr(self.loader, "batch_sampler", None)

    @property
    def dataset(self) -> Any:
        return getattr(self.loader, "dataset", None)

    def state_dict(self) -> dict[str, Any]:
        if not callable(getattr(self.loader, "state_dict", None)):
            return {}  # a plain DataLoader: nothing to resume
        return self._state if self._state is not None else self.loader.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._state = None
        if state and callable(getattr(self.loader, "load_state_dict", None)):
            self.loader.load_state_dict(state)

    def __iter__(self) -> "_PrefetchIterator":
        if self._active is not None:
            self._active.close()
        self._active = _PrefetchIterator(self)
        return self._active

    def close(self) -> None:
        if self._active is not None:
            self._active.close()
            self._active = None

    def stats(self) -> dict[str, Any]:
        return {
            "depth": self.depth,
            "batches": len(self.host_s),
            "transfer_s": describe(t for t, _ in self.host_s) if self.host_s else None,
            "transform_s": describe(t for _, t in self.host_s) if self.host_s else None,
        }


class _PrefetchIterator:
    def __init__(self, owner: DevicePrefetchLoader) -> None:
        self.owner = owner
        self.queue: queue.Queue = queue.Queue(maxsize=owner.depth)
        self.stop = threading.Event()
        self.cuda = owner.device.type == "cuda"
        self.stateful = callable(getattr(owner.loader, "state_dict", None))
        self.source: Iterator[Any] | None = None
        self.thread: threading.Thread | None = None  # started by the first next(): after Lightning set the epoch

    def _start(self) -> None:
        self.source = iter(self.owner.loader)  # here: worker start-up errors surface in the training thread
        self.thread = threading.Thread(target=self._work, name="drivebench-device-prefetch", daemon=True)
        self.thread.start()

    def _put(self, item: Any) -> bool:
        while not self.stop.is_set():
            try:
                self.queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _work(self) -> None:
        owner = self.owner
        stream = None
        try:
            if self.cuda:
                torch.cuda.set_device(owner.device)
                stream = torch.cuda.Stream(owner.device)
            for host_batch in self.source:
                if self.stop.is_set():
                    return
                with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
                    t0 = time.perf_counter()
                    batch = owner.transfer(host_batch, owner.device)
                    t1 = time.perf_counter()
                    if owner.transform is not None:
                        batch = owner.transform(batch)
                    t2 = time.perf_counter()
                    event = None
                    if stream is not None:
                        event = torch.cuda.Event()
                        event.record(stream)
                owner.host_s.append((t1 - t0, t2 - t1))
                if isinstance(batch, dict):
                    batch[READY_KEY] = True
                state = owner.loader.state_dict() if self.stateful else None  # where the loader stands after it
                if not self._put((batch, event, state)):
                    return
        except BaseException as error:  # noqa: BLE001 - handed to the training thread, re-raised there
            self._put(_Failure(error))
            return
        self._put(_END)

    def __iter__(self) -> "_PrefetchIterator":
        return self

    def __next__(self) -> Any:
        if self.thread is None:
            self._start()
        assert self.thread is not None
        while True:
            try:
                item = self.queue.get(timeout=1.0)
                break
            except queue.Empty:
                if not self.thread.is_alive():
                    raise RuntimeError("the device prefetch thread stopped without a batch or an error") from None
        if item is _END:
            raise StopIteration
        if isinstance(item, _Failure):
            raise item.error
        batch, event, state = item
        if state is not None:
            self.owner._state = state
        if event is not None:
            current = torch.cuda.current_stream(self.owner.device)
            current.wait_event(event)
            for t in _tensors(batch):
                if t.device.type == "cuda":
                    t.record_stream(current)
        return batch

    def close(self) -> None:
        self.stop.set()
        if self.thread is None:
            return
        while True:  # unblock a thread waiting to put
            try:
                self.queue.get_nowait()
            except queue.Empty:
                break
        self.thread.join(timeout=5.0)

