"""When to take a checkpoint during training (every N steps, every N minutes, at the end), and what
each save cost in TensorBoard.

This is the trigger only. A save is Lightning's ``trainer.save_checkpoint(path)``: Lightning dumps
model, optimizer, LR schedulers, loops (with the training loader's position, see
:mod:`drivebench.data.epoch_stream`) and callback states (the RNG states of
:class:`drivebench.ckpt.state.RngState`), and hands the dump to the Trainer's checkpoint IO,
:class:`drivebench.ckpt.checkpoint_io.StorageCheckpointIO`, which writes it (synchronously or on a
background thread), prunes and records it. The IO is passed to the Trainer as a plugin
(``plugins=[io]``); this callback finds it there.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import lightning.pytorch as pl

from drivebench.ckpt.checkpoint_io import StorageCheckpointIO
from drivebench.ckpt.store import CheckpointWriteError
from drivebench.errors import ConfigError
from drivebench.signals import StopOnSignal, at_optimizer_step_boundary


class Checkpointing(pl.Callback):
    """Saves checkpoints through the Trainer's :class:`StorageCheckpointIO`.

    Args:
        every_n_steps / every_n_minutes: save triggers (either, both or neither).
        save_last: save when training ends (a stop on a signal saves whatever this says).
        clock: seconds for ``every_n_minutes`` (a monotonic clock; tests pass their own).

    A save's blocking time is timed by the IO (``StorageCheckpointIO.blocking``) on the step clock
    the trainer's :class:`~drivebench.perf.callback.StepTimer` hands it (``use_step_clock``), which
    books it as checkpoint time rather than data wait.
    """

    def __init__(self, every_n_steps: int | None = None, every_n_minutes: float | None = None,
                 save_last: bool = True, clock: Callable[[], float] = time.monotonic) -> None:
        if every_n_steps is not None and (isinstance(every_n_steps, bool) or every_n_steps < 1):
            raise ConfigError(f"ckpt.every_n_steps={every_n_steps} is not valid; use a whole number >= 1 or null")
        if every_n_minutes is not None and every_n_minutes <= 0:
            raise ConfigError(f"ckpt.every_n_minutes={every_n_minutes} is not valid; use minutes > 0 or null")
        self.every_n_steps = every_n_steps
        self.every_n_minutes = every_n_minutes
        self.save_last = save_last
        self.clock = clock
        self.io: StorageCheckpointIO | None = None  # the Trainer's, found in setup
        self._logged = 0
        self._last_save_time = clock()
        self._last_saved_step = -1
        self.estimated_bytes: int | None = None  # a checkpoint's size as the preflight estimated it
        self._room_checked = False
        self._stop: StopOnSignal | None = None  # the trainer's, found at train start (read every step)

    # ---- setup: the IO and its preflight -----------------------------------------------------
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Before the first step: ckpt.dir exists, takes a write, and (locally) has room."""
        if stage != "fit":
            return
        io = trainer.strategy.checkpoint_io
        if not isinstance(io, StorageCheckpointIO) or io.store is None:
            raise TypeError(f"Checkpointing saves through a StorageCheckpointIO with a ckpt.dir; the Trainer's checkpoint "
                            f"IO is {type(io).__name__}: pass plugins=[StorageCheckpointIO(dir=...)] to the Trainer")
        self.io = io
        if trainer.is_global_zero:
            io.store.prepare()  # exists and takes a write (its room is checked once the optimizers exist)
            io.claim()  # a second live run on this directory stops here, in one line

    # ---- triggers ----------------------------------------------------------------------------
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Before the first step, with the optimizers built: does ``ckpt.dir`` have room for this run's
        checkpoints (as large as the state dict says, keep_last_k + 1 of them at the peak)?"""
        self._last_save_time = self.clock()  # every_n_minutes counts training time, not set-up
        self._stop = StopOnSignal.of(trainer)
        if trainer.is_global_zero and self.io is not None and self.io.store is not None:
            self.estimated_bytes = estimate_checkpoint_bytes(pl_module, trainer.optimizers)
            self.io.store.prepare(self.estimated_bytes * self._copies_to_come())

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        assert self.io is not None
        self._log_completed(trainer)  # async writes that finished since the last step
        if self.io.async_write and self.io.staging_reserved is None and trainer.is_global_zero:
            # after the first optimizer step (Adam's moments exist from then on), as the dump lays them out
            self.io.reserve_staging({"state_dict": pl_module.state_dict(),
                                     "optimizer_states": [opt.state_dict() for opt in trainer.optimizers]},
                                    trainer.global_step)
        if not at_optimizer_step_boundary(trainer, batch_idx):
            return  # mid-accumulation: the gradients summed so far would not be in the checkpoint
        step = trainer.global_step
        due = bool(self.every_n_steps and step % self.every_n_steps == 0)
        if self.every_n_minutes and not due:
            elapsed = self.clock() - self._last_save_time >= 60 * self.every_n_minutes
            # every rank must take the save (Lightning's save has a barrier): rank 0's clock decides
            due = bool(trainer.strategy.broadcast(elapsed, src=0)) if trainer.world_size > 1 else elapsed
        # a stop signal agreed at this boundary (StopOnSignal runs before this callback): save here, mid-epoch, with
        # the loops' state of this step; saved at train end, after Lightning has closed the epoch that should_stop
        # ended, the checkpoint would say that epoch is done, and a resume would skip the rest of its batches
        stopping = self._stop is not None and self._stop.stopped is not None and self._stop.stopped["step"] == step
        if (due or stopping) and step != self._last_saved_step:
            self.save(trainer)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        assert self.io is not None
        stop = StopOnSignal.of(trainer)
        interrupted = stop is not None and stop.stopped is not None
        try:
            # a stop on a signal always saves: the job is going away and continues from here
            if (self.save_last or interrupted) and trainer.global_step != self._last_saved_step:
                self.save(trainer)
        finally:
            self.io.finish()
        self._log_completed(trainer)

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        if self.io is not None:  # let a write in flight complete: the newest checkpoint is then the newest possible
            self.io.wait()

    def on_load_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        self._last_saved_step = int(checkpoint.get("global_step", -1))  # already on disk: no save_last

    # ---- saving ------------------------------------------------------------------------------
    def save(self, trainer: pl.Trainer) -> None:
        """Checkpoint the training state now, on every rank (Lightning's IO writes on rank 0 only).
        Blocking time: everything until training may go on (sync: the whole write; async: waiting
        for the previous write, then the copy to the host)."""
        assert self.io is not None
        step = trainer.global_step
        self._last_saved_step = step
        self._last_save_time = self.clock()
        _flush_loggers(trainer)  # what was logged up to this step is on disk before its checkpoint is
        with self.io.blocking():
            trainer.save_checkpoint(self.io.path_for(step), weights_only=False)
        self._log_completed(trainer)

    def _copies_to_come(self) -> int:
        """Checkpoints of this run that will be written before pruning frees any space: keep_last_k + 1 at the
        peak, less those already there (keep_last_k=0 keeps all: room for the next one, at least)."""
        assert self.io is not None and self.io.store is not None
        keep = self.io.keep_last_k
        if not keep:
            return 1
        present = sum(1 for f in self.io.store.list_checkpoints() if f.belongs_to(self.io.identity))
        return max(keep + 1 - min(present, keep), 1)

    def _check_room(self) -> None:
        """After the first completed save: its measured size, not the estimate, against the room left. A
        directory that cannot take the checkpoints still to come stops the run now, with this checkpoint
        written, rather than at the save that would fail."""
        if self._room_checked or self.io is None or self.io.store is None or not self.io.saves:
            return
        self._room_checked = True
        size = int(self.io.saves[0]["bytes"] or 0)
        free = self.io.store.free_bytes()
        more = self._copies_to_come()  # the one just written counts among those present
        if free is None or more <= 0 or free >= size * more:
            return
        err = CheckpointWriteError(
            f"ckpt.dir={self.io.store.path} has {free / 2**20:.0f} MiB free, but this run's checkpoints are "
            f"{size / 2**20:.1f} MiB each (measured at its first save; estimated "
            f"{(self.estimated_bytes or 0) / 2**20:.1f} MiB) and {more} more will be on disk before pruning frees "
            "any (ckpt.keep_last_k + 1 at the peak); free space, lower ckpt.keep_last_k, or choose another "
            "ckpt.dir", full=True)
        raise err.with_advice(self.io.continue_advice(err))

    def _log_completed(self, trainer: pl.Trainer) -> None:
        """Log every completed save not logged yet, at the step it was taken (an async write
        completes later, so its figures are logged at a later hook, under its own step); check the room
        for the rest once the first save's size is known."""
        if trainer.is_global_zero:
            self._check_room()
        if trainer.logger is None or not trainer.is_global_zero or self.io is None:
            return
        done = self.io.saves[self._logged:]
        self._logged += len(done)
        for record in done:
            metrics = {"perf/ckpt_write_s": record["write_s"], "perf/ckpt_mb": record["bytes"] / 2**20}
            if record["blocking_s"] is not None:
                metrics["perf/ckpt_blocking_s"] = record["blocking_s"]
            if record["mb_per_s"]:
                metrics["perf/ckpt_mb_per_s"] = record["mb_per_s"]
            trainer.logger.log_metrics(metrics, step=record["step"])

    # ---- summary -----------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        """The ``checkpoints`` section of summary.json: the IO's record and the triggers in effect."""
        assert self.io is not None
        return {**self.io.summary(), "estimated_bytes": self.estimated_bytes, "every_n_steps": self.every_n_steps,
                "every_n_minutes": self.every_n_minutes}


def _flush_loggers(trainer: pl.Trainer) -> None:
    """Flush every logger before a checkpoint is written (rank 0 logs): a kill right after the checkpoint
    must not lose steps that the resumed run will not log again. A logger that can (the bench's
    :class:`~drivebench.bench.phase_logger.PhaseLogger`) also flushes the step's losses, which Lightning logs
    after this hook."""
    if not trainer.is_global_zero:
        return
    for logger in trainer.loggers:
        flush = getattr(logger, "flush", None)
        if callable(flush):
            try:
                flush(then_next=True)
            except TypeError:
                flush()
            continue
        flush = getattr(getattr(logger, "experiment", None), "flush", None)
        if callable(flush):
            flush()


# optimizer state tensors per parameter, for the optimizers whose state does not exist before their first step
_STATE_PER_PARAM = {"Adam": 2, "AdamW": 2, "Adamax": 2, "NAdam": 2, "RAdam": 2, "Adagrad": 1, "Adadelta": 2,
                    "RMSprop": 1, "Rprop": 2, "ASGD": 2, "LBFGS": 2}
_OVERHEAD = 2**20  # loops, RNG states, the run's config and identity, pickle framing


def estimate_checkpoint_bytes(pl_module: pl.LightningModule, optimizers: list[Any]) -> int:
    """The size of this run's checkpoints, from what they hold: the module's state dict (parameters and
    buffers), each optimizer's state (exact once it exists, as after a resume; before the first step, its
    tensors per parameter by optimizer class: Adam 2, SGD with momentum 1...), and a fixed allowance."""
    import torch

    def nbytes(obj: Any) -> int:
        if isinstance(obj, torch.Tensor):
            return obj.numel() * obj.element_size()
        if isinstance(obj, dict):
            return sum(nbytes(v) for v in obj.values())
        if isinstance(obj, (list, tuple)):
            return sum(nbytes(v) for v in obj)
        return 0

    total = nbytes(pl_module.state_dict())
    for opt in optimizers:
        if any(opt.state.values()):
            total += nbytes(opt.state_dict()["state"])
            continue
        per_param = _STATE_PER_PARAM.get(type(opt).__name__, 2)
        if type(opt).__name__ == "SGD":
            per_param = 1 if any(g.get("momentum", 0) for g in opt.param_groups) else 0
        total += per_param * sum(nbytes(p) for g in opt.param_groups for p in g["params"] if p.requires_grad)
    return total + _OVERHEAD
