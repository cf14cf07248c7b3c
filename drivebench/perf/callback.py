"""The Lightning callback that times every training step and splits it into where the time went.

Per step (host clock, ``time.perf_counter``):

    ... previous batch end | data wait | h2d | gpu preprocess | compute (fwd+bwd+opt) | batch end
                           ^ next() on the loader returns      ^ on_train_batch_start

* data wait: host time blocked in the train loader's ``next()`` (timed by
  :class:`~drivebench.perf.loader_wait.LoaderWaitProfiler`, the trainer's profiler);
* loop overhead: the rest of the gap between two steps (Lightning's bookkeeping, and the host
  waiting for the device when logged values are read back), minus checkpoint time (reported on its
  own). Without that profiler the whole gap counts as data wait (the older, coarser split);
* h2d / gpu_preprocess: host time of the copy to the device and of device-side preprocessing;
* compute: host time from ``on_train_batch_start`` to ``on_train_batch_end``.

The timer owns the run's :class:`~drivebench.perf.clock.StepClock`: when its trainer is set up it
hands the clock to every part that records into it (the datamodule's batch-transfer hooks mark the
fetch and time ``h2d`` and ``gpu_preprocess``, the loader-wait profiler adds ``loader_next``, the
checkpoint callback times ``ckpt``) and takes it back at teardown; it reads and clears the clock
once per step. No recorder is global, so two trainers (fit, then the ceiling) never share one.

On CUDA, the same spans are also timed with CUDA events on the device (``device_*``), read back
lazily (``Event.query``) so that measuring never adds a host-device synchronisation unless
``sync_each_step`` asks for one. Warm-up steps are recorded but flagged, and excluded from every
statistic. Validation time is cut out of the step clock (as Lightning's ThroughputMonitor does), and
the clock records nothing while validation batches pass through the hooks.

Each validation during fit (not the sanity check) gets a :class:`ValidationRecord`, split at the
timer's own hooks (Lightning 2.6's ``_EvaluationLoop.run``; host clock only)::

    step end | lead-in | val start | first wait | batch start | forward | batch end | wait | batch start
             | forward | batch end ... last batch end | epoch end | val end

* lead-in (outside the validation's ``wall_s``; it stays in the next step's gap, as before): the
  rest of the last step's batch-end hooks and its logging, then the loop's ``setup_data`` and
  ``reset``, where ``iter()`` on the validation loader starts workers that do not persist (and
  fetches the first batch of a loader without ``len``), then ``on_validation_model_eval``. No
  callback hook runs between the last ``on_train_batch_end`` and ``on_validation_start``. Checkpoint
  saves in it are left out (they are the next step's ``ckpt_s``);
* first wait: the other ``on_validation_start`` hooks, ``on_validation_epoch_start`` (metric
  reset), the first ``next()`` on the loader (the workers' own start-up, ``worker_init_fn``
  included, and their first batch) and its batch-transfer hooks (the copy to the device);
* wait: between one batch end and the next batch start: the end hooks' logging, the loader's
  ``next()`` and the copy to the device (with a second validation loader, its iterator's start;
  the batch hooks then get its ``dataloader_idx``, and ``batches`` counts every loader's);
* forward: batch start to batch end: ``validation_step`` (forward, loss, metric update), with the
  batch hooks of the callbacks after the timer (start) and before it (end);
* epoch end: from the last batch end to ``on_validation_end``: ``on_validation_epoch_end`` (metric
  compute and sync), Lightning's epoch-end logging, and the ``on_validation_end`` hooks of callbacks
  listed before the timer.

No synchronisation is added on CUDA: device work the forwards queued is paid wherever the host next
waits for the device (a metric update's read-back in a later forward, or the epoch end's compute), so
on a GPU ``forward_s`` can read low and ``wait_s`` or ``epoch_end_s`` high for the forwards' kernels.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_only

from drivebench.perf.clock import CKPT, FETCHED, GPU_PREPROCESS, H2D, LOADER_NEXT, RecordsSteps, StepClock
from drivebench.perf.loader_wait import LoaderWaitProfiler
from drivebench.perf.system import SystemMonitor

TAG_GROUP = "perf"  # every phase's per-step scalars: perf/<name>, under the phase's prefix in TensorBoard


@dataclass
class StepRecord:
    """Timings of one optimizer step, in seconds."""

    step: int
    warmup: bool
    samples: int
    step_s: float
    data_wait_s: float
    h2d_s: float
    gpu_preprocess_s: float
    compute_s: float
    ckpt_s: float = 0.0
    loop_overhead_s: float = 0.0
    loss: float | None = None
    device_compute_s: float | None = None
    device_h2d_s: float | None = None
    profiled: bool = False  # under torch.profiler (bench.profile): its overhead keeps it out of the statistics
    elements: int = 0  # tensor elements in the batch: the work of a variable-size batch (agents, map elements)


@dataclass
class ValidationRecord:
    """One validation during fit, in seconds of host time (the split: this module's docstring).

    ``first_wait_s + wait_s + forward_s + epoch_end_s == wall_s``; ``lead_in_s`` is outside ``wall_s``.
    """

    index: int
    step: int  # trainer.global_step it ran at (the steps trained before it)
    wall_s: float = 0.0
    batches: int = 0
    lead_in_s: float = 0.0
    first_wait_s: float = 0.0
    wait_s: float = 0.0
    forward_s: float = 0.0
    epoch_end_s: float = 0.0


@dataclass
class PhaseTimes:
    """All step records of one phase (``train`` or ``ceiling``) plus its losses."""

    name: str
    records: list[StepRecord] = field(default_factory=list)
    started: float | None = None
    ended: float | None = None
    measured_started: float | None = None

    def measured(self) -> list[StepRecord]:
        return [r for r in self.records if not r.warmup and not r.profiled]

    def profiled(self) -> list[StepRecord]:
        return [r for r in self.records if r.profiled]


class StepTimer(pl.Callback):
    """Record a :class:`StepRecord` per training step and log ``perf/*`` scalars to the logger.

    Args:
        phase: the name of the timed phase (:attr:`PhaseTimes.name`: ``train``, ``ceiling``). The
            TensorBoard tags are ``perf/*`` in every phase; the phase's logger puts the phase in
            front (``fit/perf/*``, ``ceiling/perf/*``: ``drivebench.bench.phase_logger``).
        warmup_steps: the first steps, flagged and excluded from statistics.
        sync_each_step: synchronise the device at every step end (exact attribution, at the cost of
            the overlap between consecutive steps); off by default.
        log_every_n_steps: how often per-step scalars go to the logger.
        monitor: optional :class:`SystemMonitor` whose latest sample is logged alongside.
        profiled_steps: the steps right after warm-up that run under ``torch.profiler``
            (:class:`~drivebench.perf.profiler.ProfileSteps`, its own warm-up step included): recorded,
            flagged ``profiled`` and excluded from the statistics like warm-up.
    """

    def __init__(
        self,
        phase: str = "train",
        warmup_steps: int = 10,
        sync_each_step: bool = False,
        log_every_n_steps: int = 1,
        monitor: SystemMonitor | None = None,
        profiled_steps: int = 0,
    ) -> None:
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
        if log_every_n_steps < 1:
            raise ValueError(f"log_every_n_steps must be >= 1, got {log_every_n_steps}")
        self.phase = phase
        self.warmup_steps = warmup_steps
        self.sync_each_step = sync_each_step
        self.log_every_n_steps = log_every_n_steps
        self.monitor = monitor
        self.profiled_steps = profiled_steps
        self.times = PhaseTimes(phase)
        self.validations: list[ValidationRecord] = []  # one per validation during fit, sanity check excluded
        self.clock = StepClock()  # handed to the trainer's recorders in setup(), read per step
        self._use_cuda = False
        self._loader_timed = False
        self._t_prev_end = 0.0
        self._t_batch_start = 0.0
        self._t_step_end = 0.0  # the last step's end: where a validation's lead-in starts
        self._val: ValidationRecord | None = None  # the validation in flight
        self._t_val_mark = 0.0  # its last hook boundary
        self._step_events: torch.cuda.Event | None = None
        self._pending: list[tuple[StepRecord, torch.cuda.Event, torch.cuda.Event, tuple | None, Any]] = []
        self._n_steps = 0

    # ---- lifecycle ---------------------------------------------------------------------------
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        for part in _recorders(trainer):
            part.use_step_clock(self.clock)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        for part in _recorders(trainer):
            part.use_step_clock(None)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._use_cuda = pl_module.device.type == "cuda"
        profiler = trainer.profiler
        self._loader_timed = isinstance(profiler, LoaderWaitProfiler) and profiler.step_clock is self.clock
        self.clock.enabled = True
        self.clock.use_cuda_events = self._use_cuda
        self.clock.pop()
        if self.monitor is not None:
            self.monitor.start()
        now = time.perf_counter()
        self.times.started = now
        self._t_prev_end = now
        self._t_step_end = now

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._use_cuda:
            torch.cuda.synchronize()
        self._harvest(block=True)
        self.times.ended = time.perf_counter()
        self.clock.enabled = False

    # ---- validation during fit -----------------------------------------------------------------
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != TrainerFn.FITTING:
            return
        now = time.perf_counter()
        ckpt = self.clock.durations.get(CKPT, 0.0)  # a save since the step end: the next step's, not the lead-in's
        self._t_val_mark = now
        self._val = ValidationRecord(index=len(self.validations), step=trainer.global_step,
                                     lead_in_s=max(now - self._t_step_end - ckpt, 0.0))
        self.clock.enabled = False  # validation batches' copies and transforms are no step's

    def on_validation_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                                  batch_idx: int, dataloader_idx: int = 0) -> None:
        if self._val is None:
            return
        now = time.perf_counter()
        if self._val.batches == 0:
            self._val.first_wait_s = now - self._t_val_mark
        else:
            self._val.wait_s += now - self._t_val_mark
        self._t_val_mark = now

    def on_validation_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                                batch_idx: int, dataloader_idx: int = 0) -> None:
        if self._val is None:
            return
        now = time.perf_counter()
        self._val.forward_s += now - self._t_val_mark
        self._val.batches += 1
        self._t_val_mark = now

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._val is None:
            return
        record, self._val = self._val, None
        record.epoch_end_s = time.perf_counter() - self._t_val_mark
        record.wall_s = record.first_wait_s + record.wait_s + record.forward_s + record.epoch_end_s
        self.validations.append(record)
        self._t_prev_end += record.wall_s
        self.clock.enabled = True
        self._log_validation(trainer, record)

    # ---- per step ----------------------------------------------------------------------------
    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        self._t_batch_start = time.perf_counter()
        if self._use_cuda:
            start = torch.cuda.Event(enable_timing=True)
            start.record()
            self._step_events = start

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs  # {} for a skipped step (None returned)
        loss_host = None
        if isinstance(loss, torch.Tensor):
            # an asynchronous copy: its value is read once the step's end event has completed
            loss_host = loss.detach().float().to("cpu", non_blocking=True)
        end_event = None
        if self._use_cuda:
            end_event = torch.cuda.Event(enable_timing=True)
            end_event.record()
            if self.sync_each_step:
                end_event.synchronize()
        t_end = time.perf_counter()
        marks, durations, cuda_spans = self.clock.pop()
        fetched = marks.get(FETCHED, self._t_batch_start)
        ckpt = durations.get(CKPT, 0.0)
        gap = max(fetched - self._t_prev_end - ckpt, 0.0)
        data_wait = min(durations.get(LOADER_NEXT, 0.0), gap) if self._loader_timed else gap
        record = StepRecord(
            step=self._n_steps,
            warmup=self._n_steps < self.warmup_steps,
            profiled=self.warmup_steps <= self._n_steps < self.warmup_steps + self.profiled_steps,
            samples=_batch_size(pl_module, batch),
            step_s=t_end - self._t_prev_end,
            data_wait_s=data_wait,
            h2d_s=durations.get(H2D, 0.0),
            gpu_preprocess_s=durations.get(GPU_PREPROCESS, 0.0),
            compute_s=t_end - self._t_batch_start,
            ckpt_s=ckpt,
            loop_overhead_s=gap - data_wait,
        )
        if self._n_steps == self.warmup_steps + self.profiled_steps:
            self.times.measured_started = self._t_prev_end
        self._n_steps += 1
        record.elements = batch_elements(batch)  # after t_end: its walk falls into the next step's loop overhead
        self.times.records.append(record)
        if end_event is not None and self._step_events is not None:
            self._pending.append((record, self._step_events, end_event, cuda_spans.get(H2D), loss_host))
            self._harvest(block=False)
        elif loss_host is not None:
            record.loss = float(loss_host)
        self._t_prev_end = self._t_step_end = t_end
        if record.step % self.log_every_n_steps == 0:
            self._log(trainer, record)

    # ---- helpers -----------------------------------------------------------------------------
    def _harvest(self, block: bool) -> None:
        """Read back CUDA event timings of finished steps (never waits unless ``block``)."""
        still = []
        for item in self._pending:
            record, start, end, h2d, loss_host = item
            if block or end.query():
                record.device_compute_s = start.elapsed_time(end) / 1e3
                if h2d is not None:
                    record.device_h2d_s = h2d[0].elapsed_time(h2d[1]) / 1e3
                if loss_host is not None:
                    record.loss = float(loss_host)
            else:
                still.append(item)
        self._pending = still

    @rank_zero_only
    def _log(self, trainer: pl.Trainer, record: StepRecord) -> None:
        if trainer.logger is None:
            return
        p = TAG_GROUP
        metrics = {
            f"{p}/step_time_s": record.step_s,
            f"{p}/data_wait_s": record.data_wait_s,
            f"{p}/h2d_s": record.h2d_s,
            f"{p}/loop_overhead_s": record.loop_overhead_s,
            f"{p}/compute_s": record.compute_s,
            f"{p}/samples_per_s": record.samples / record.step_s if record.step_s > 0 else 0.0,
            f"{p}/data_wait_frac": record.data_wait_s / record.step_s if record.step_s > 0 else 0.0,
            f"{p}/batch_elements": float(record.elements),
        }
        if record.gpu_preprocess_s:
            metrics[f"{p}/gpu_preprocess_s"] = record.gpu_preprocess_s
        done = [r for r in self.times.records[-8:] if r.device_compute_s is not None]
        if done:
            metrics[f"{p}/device_compute_s"] = done[-1].device_compute_s
        if self.monitor is not None and (sample := self.monitor.latest()) is not None:
            if sample.gpu_util_pct is not None:
                metrics[f"{p}/gpu_util_pct"] = sample.gpu_util_pct
                metrics[f"{p}/gpu_mem_gb"] = sample.gpu_mem_gb
            metrics[f"{p}/cpu_main_pct"] = sample.cpu_main_pct
            metrics[f"{p}/cpu_workers_pct"] = sample.cpu_workers_pct
        if torch.cuda.is_available() and self._use_cuda:
            metrics[f"{p}/gpu_mem_allocated_gb"] = torch.cuda.memory_allocated() / 2**30
        trainer.logger.log_metrics(metrics, step=trainer.global_step)

    @rank_zero_only
    def _log_validation(self, trainer: pl.Trainer, record: ValidationRecord) -> None:
        """One point per validation, at the step it ran at (``fit/perf/val_*`` under the phase logger)."""
        if trainer.logger is None:
            return
        parts = ("wall_s", "lead_in_s", "first_wait_s", "wait_s", "forward_s", "epoch_end_s")
        trainer.logger.log_metrics({f"{TAG_GROUP}/val_{part}": getattr(record, part) for part in parts},
                                   step=trainer.global_step)


def _recorders(trainer: pl.Trainer) -> list[RecordsSteps]:
    """The parts of ``trainer`` that record into a step clock: its profiler, its datamodule, its
    callbacks and its checkpoint IO plugin (whichever of them implement :class:`RecordsSteps`)."""
    parts = [trainer.profiler, trainer.datamodule, trainer.strategy.checkpoint_io, *trainer.callbacks]
    return [part for part in parts if isinstance(part, RecordsSteps)]


def batch_elements(batch: Any) -> int:
    """Elements of every tensor in ``batch`` (nested dicts, lists, tuples): what a batch of scenes with
    more agents or map elements weighs, so a ceiling on one batch can be compared with training's."""
    if isinstance(batch, torch.Tensor):
        return batch.numel()
    if isinstance(batch, dict):
        return sum(batch_elements(v) for v in batch.values())
    if isinstance(batch, (list, tuple)):
        return sum(batch_elements(v) for v in batch)
    return 0


def _batch_size(pl_module: pl.LightningModule, batch: Any) -> int:
    fn = getattr(pl_module, "batch_size", None)
    if callable(fn):
        try:
            return int(fn(batch))
        except NotImplementedError:
            pass
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0])
    return 1
