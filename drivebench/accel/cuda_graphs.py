"""``accel.cuda_graphs``: the training forward (net + loss) and its backward replayed as CUDA graphs.

Why: a small model's eager step launches thousands of tiny kernels, and the host's launch time,
not the GPU, bounds the step (QCNet on an H200: main process at 100% of a core, GPU busy ~50%).
A captured graph launches them all with one call. The optimizer step stays eager (a few
multi-tensor kernels).

How: :class:`GraphedLoss` keeps one ``torch.cuda.make_graphed_callables`` capture per input
shape. The model pads every batch to one of a few shapes first (the LightningModule's
``static_batch``; QCNet: ``models/qcnet/static_shapes.py``), so only a few graphs are captured.
Each capture runs ``warmup_iters`` forward+backward passes on a side stream (no parameter update:
``torch.autograd.grad``), then records; its step is slow and usually falls in the warm-up steps. All
shapes' graphs share one memory pool (only one replays at a time), so the device holds one step's
activations, not one per shape.

Graphs live for one ``Trainer.fit``: the LightningModule releases them when the next fit starts,
because Lightning frees the cuBLAS workspaces at the end of each fit and captured matmuls point
into them.

Constraints, checked where the knob is resolved (``accel/settings.py`` and ``app.py``): a CUDA
device, one process (DDP's gradient hooks would fire inside the captured backward),
``accumulate_grad_batches=1`` (the captured backward writes each step's gradients into the same
buffers), and autocast without its weight-cast cache (casts are recorded into the graph).
"""

from __future__ import annotations

import gc
import inspect
import time
from typing import Any, Callable, Mapping, Sequence

import torch
from torch import nn

LossFn = Callable[[Mapping[str, Any]], Mapping[str, torch.Tensor]]


class _FlatLoss(nn.Module):
    """``loss_fn`` on a batch given as positional tensors (what ``make_graphed_callables`` takes)."""

    def __init__(self, owner: nn.Module, loss_fn: LossFn, keys: Sequence[str], static: Mapping[str, Any],
                 names: list[str]) -> None:
        super().__init__()
        self.owner = owner  # registers the parameters, whose gradients the backward graph returns
        self._loss_fn = loss_fn
        self._keys = tuple(keys)
        self._static = dict(static)
        self._names = names

    def forward(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        batch = dict(self._static)
        batch.update(zip(self._keys, tensors))
        losses = self._loss_fn(batch)
        if not self._names:
            self._names.extend(losses)
        return tuple(losses[name] for name in self._names)


def _autocast_without_cache(device_type: str = "cuda") -> torch.autocast:
    """The autocast state in effect (Lightning's precision plugin), with the weight-cast cache off."""
    enabled = torch.is_autocast_enabled(device_type)
    dtype = torch.get_autocast_dtype(device_type) if enabled else torch.bfloat16
    return torch.autocast(device_type, dtype=dtype, enabled=enabled, cache_enabled=False)


# the loader's pin-memory thread allocates pinned host memory (cudaHostAlloc) while the training thread captures;
# in CUDA's default global capture mode that call invalidates the capture (seen on the H200 at a validation
# capture, b36): capture in thread_local mode where this torch's make_graphed_callables takes the argument
_THREAD_LOCAL_CAPTURE = ({"capture_error_mode": "thread_local"}
                         if "capture_error_mode" in inspect.signature(torch.cuda.make_graphed_callables).parameters
                         else {})


class _GraphsPerShape:
    """What both graph kinds keep: one capture per batch signature (tensor keys, shapes, dtypes), a bound on
    how many, capture times, replays, and :meth:`release`."""

    def __init__(self, warmup_iters: int, max_graphs: int) -> None:
        self.warmup_iters = warmup_iters
        self.max_graphs = max_graphs
        self._graphs: dict[tuple, Any] = {}
        self.capture_s: list[float] = []
        self.replays = 0
        self._released = 0  # graphs captured and since dropped (see release)
        self._pool: Any = None

    def _shared_pool(self) -> Any:
        """One memory pool for every graph of this kind: one graph replays at a time (a training step's forward
        and its backward back to back), so a capture may reuse the memory of the others' intermediates. With a
        pool per shape the device held the sum of the shapes' activations (QCNet at max on an H200: 56-67 GiB
        reserved for a step that allocates 10 GiB, b36), and every recapture added more."""
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        return self._pool

    @staticmethod
    def _split(batch: Mapping[str, Any]) -> tuple[list[str], dict[str, Any], tuple[torch.Tensor, ...], tuple]:
        """The batch's tensor keys (sorted), its other entries, its tensors, and their signature."""
        keys = sorted(k for k, v in batch.items() if isinstance(v, torch.Tensor))
        static = {k: v for k, v in batch.items() if not isinstance(v, torch.Tensor)}
        tensors = tuple(batch[k] for k in keys)
        return keys, static, tensors, tuple((k, tuple(t.shape), t.dtype) for k, t in zip(keys, tensors))

    def _check_room(self, what: str) -> None:
        if len(self._graphs) >= self.max_graphs:
            raise RuntimeError(f"accel.cuda_graphs: more than {self.max_graphs} {what} shapes; the model's padding "
                               "should map batches to a few shapes")

    def release(self) -> None:
        """Drop every captured graph (and its memory pool); the next call of each shape captures anew.
        The counts in :meth:`describe` keep the history.

        A capture lives in reference cycles (``make_graphed_callables`` sets a closure over the module as its
        ``forward``, and keeps the graphs in an autograd Function class made per call), which reference
        counting never frees: without a collection here, released graphs kept their static buffers and memory
        pools until Python's next full collection (H200, b37: an ``accel=auto`` run whose in-run trial
        recaptured at each switch ran out of memory with 125 GiB in graph pools)."""
        if not self._graphs:
            return
        self._released += len(self._graphs)
        self._graphs.clear()
        self._pool = None  # freed with its last graph; the next capture takes a new one
        gc.collect()

    def describe(self) -> dict[str, Any]:
        return {"graphs": self._released + len(self._graphs), "capture_s": [round(s, 3) for s in self.capture_s],
                "replays": self.replays}


class GraphedLoss(_GraphsPerShape):
    """``loss_fn(batch)`` with forward and backward replayed from a CUDA graph per batch shape.

    Args:
        owner: the module whose parameters the loss depends on (the LightningModule or its net).
        loss_fn: batch -> named loss tensors; the batch's tensors must all be on the device.
        warmup_iters: eager passes before each capture (cuDNN/cuBLAS pick their kernels there).
        max_graphs: more distinct shapes than this is an error (the padder should prevent it).
    """

    def __init__(self, owner: nn.Module, loss_fn: LossFn, warmup_iters: int = 3, max_graphs: int = 16) -> None:
        super().__init__(warmup_iters, max_graphs)
        self.owner = owner
        self.loss_fn = loss_fn
        self._names: list[str] = []

    def __call__(self, batch: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        keys, static, tensors, signature = self._split(batch)
        with _autocast_without_cache(tensors[0].device.type):
            graphed = self._graphs.get(signature)
            if graphed is None:
                graphed = self._capture(signature, keys, static, tensors)
            outputs = graphed(*tensors)
        self.replays += 1
        # the graph's outputs are its static buffers, overwritten by the next replay: hand out copies
        return {name: out.clone() for name, out in zip(self._names, outputs)}

    def _capture(self, signature: tuple, keys: list[str], static: dict[str, Any],
                 tensors: tuple[torch.Tensor, ...]) -> nn.Module:
        self._check_room("batch")
        t0 = time.perf_counter()
        flat = _FlatLoss(self.owner, self.loss_fn, keys, static, self._names)
        flat.train(self.owner.training)
        graphed = torch.cuda.make_graphed_callables(flat, tensors, num_warmup_iters=self.warmup_iters,
                                                    allow_unused_input=True, pool=self._shared_pool(),
                                                    **_THREAD_LOCAL_CAPTURE)
        torch.cuda.synchronize()
        self.capture_s.append(time.perf_counter() - t0)
        self._graphs[signature] = graphed
        return graphed


class GraphedForward(_GraphsPerShape):
    """``fn(batch)`` (a forward without gradients: validation) replayed from a CUDA graph per batch shape.

    Why: validation runs the model's forward eagerly on unpadded batches (QCNet: compiled units
    would recompile for every batch's edge counts), and a small model's eager forward is launch-bound
    as its training step was (QCNet at ``max`` on an H200: ~6 s per validation of 50 batches, a third
    of an epoch's time). Padded to a few shapes and captured once each, a validation batch costs one
    replay.

    How: per shape, ``warmup_iters`` eager calls on a side stream (cuDNN/cuBLAS pick kernels, the
    allocator settles), then one capture into a memory pool the graphs share (they never run at the
    same time, and each keeps its own inputs and outputs). A call copies the batch into the graph's
    input buffers, replays, and returns copies of its outputs. Graphs point into cuBLAS workspaces
    that Lightning frees when a fit ends: :meth:`release` them at each fit's start, as
    :class:`GraphedLoss`'s are.

    Args:
        fn: batch -> named output tensors; the batch's tensors must all be on the device.
        warmup_iters: eager calls before each capture.
        max_graphs: more distinct shapes than this is an error (the padder should prevent it).
    """

    def __init__(self, fn: LossFn, warmup_iters: int = 2, max_graphs: int = 16) -> None:
        super().__init__(warmup_iters, max_graphs)
        self.fn = fn

    def __call__(self, batch: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        keys, static, tensors, signature = self._split(batch)
        entry = self._graphs.get(signature)
        if entry is None:
            entry = self._capture(signature, keys, static, tensors)
        graph, inputs, outputs = entry
        for buffer, tensor in zip(inputs, tensors):
            buffer.copy_(tensor, non_blocking=True)
        graph.replay()
        self.replays += 1
        return {name: out.clone() for name, out in outputs.items()}

    def _capture(self, signature: tuple, keys: list[str], static: dict[str, Any],
                 tensors: tuple[torch.Tensor, ...]) -> tuple:
        self._check_room("validation batch")
        t0 = time.perf_counter()
        inputs = tuple(t.clone() for t in tensors)
        batch = {**static, **dict(zip(keys, inputs))}
        with _autocast_without_cache(tensors[0].device.type):
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(self.warmup_iters):
                    self.fn(batch)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            # thread_local: see _THREAD_LOCAL_CAPTURE (H200, b36: "operation failed due to a previous error during
            # capture" at a cold run's first validation, in global mode)
            with torch.cuda.graph(graph, pool=self._shared_pool(), capture_error_mode="thread_local"):
                outputs = dict(self.fn(batch))
        torch.cuda.synchronize()
        self.capture_s.append(time.perf_counter() - t0)
        entry = (graph, inputs, outputs)
        self._graphs[signature] = entry
        return entry


def settle_cuda_graphs(requested: str, supports_static_shapes: bool, world_size: int,
                       accumulate_grad_batches: int) -> tuple[bool, str]:
    """Whether this run replays CUDA graphs, and why (``requested`` is the machine-resolved knob).

    ``auto`` turns them off with the reason where they cannot work; ``on`` there is a bad config
    (``ValueError``, reported as one line by the caller).
    """
    if requested == "off":
        return False, "off"
    blockers = []
    if not supports_static_shapes:
        blockers.append("the model does not pad its batches to static shapes")
    if world_size > 1:
        blockers.append(f"{world_size} processes (DDP's gradient hooks cannot run inside a captured backward)")
    if accumulate_grad_batches != 1:
        blockers.append(f"trainer.accumulate_grad_batches={accumulate_grad_batches} (the captured backward "
                        "reuses its gradient buffers every step)")
    if not blockers:
        return True, "on"
    if requested == "on":
        raise ValueError("accel.cuda_graphs=on cannot work here: " + "; ".join(blockers) + " (use auto or off)")
    return False, "off: " + "; ".join(blockers)
