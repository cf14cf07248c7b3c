"""Checkpointing during training: when to save, synchronously or off the training thread, and
what a save costs.

A save snapshots the Lightning checkpoint (model, optimizer, scheduler, loops, callbacks) plus
drivebench's own state (:mod:`drivebench.ckpt.state`: RNG states and the data position), so that
``resume`` continues the same sample stream and the same dropout masks.

* synchronous (``ckpt=local``/``remote``): serialise and write on the training thread; the whole
  write is blocking time.
* asynchronous (``ckpt=async``): copy every tensor off the training state (device tensors into
  reused page-locked host buffers, no second copy on the device), then serialise and write on a
  background thread; only the copy (and waiting for a previous write still in flight) blocks. A
  failed background write is raised at the next save or at the end of training.

Only global rank 0 writes (DDP replicas hold the same state).
"""

from __future__ import annotations

import logging
import os
import signal
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

import lightning.pytorch as pl
import torch

from drivebench.ckpt.state import ResumeState
from drivebench.ckpt.store import CheckpointStore, checkpoint_name
from drivebench.errors import ConfigError
from drivebench.perf.clock import CKPT, StepClock
from drivebench.perf.stats import describe
from drivebench.secrets import install_log_redaction, secret_values

log = logging.getLogger(__name__)
FAULT_ENV = "DRIVEBENCH_FAULT_KILL_DURING_CKPT_STEP"  # test hook: SIGKILL half-way through this step's write


class HostStager:
    """Copies a nested checkpoint's tensors off the training state: device tensors into page-locked
    host buffers reused across saves (no second copy on the device, asynchronous copies), host
    tensors into fresh copies. Either way the background writer never sees a tensor that training
    keeps updating in place."""

    def __init__(self, pin: bool | None = None) -> None:
        self._buffers: dict[str, torch.Tensor] = {}
        self.pin = torch.cuda.is_available() if pin is None else pin

    def _buffer(self, obj: torch.Tensor, path: str) -> torch.Tensor:
        buf = self._buffers.get(path)
        if buf is None or buf.shape != obj.shape or buf.dtype != obj.dtype:
            buf = torch.empty(obj.shape, dtype=obj.dtype, pin_memory=self.pin)
            self._buffers[path] = buf
        return buf

    def reserve(self, obj: Any, path: str = "") -> int:
        """Allocate the buffers that staging ``obj`` will use, without copying; returns their bytes.
        Why: page-locking ~0.4 GB (MapTR weights + Adam moments) took 0.36-0.41 s on the H200, all
        charged to the first save's blocking time; done once before that save, every save costs the
        copy alone (0.02-0.03 s)."""
        if isinstance(obj, torch.Tensor):
            if obj.device.type == "cpu":
                return 0
            buf = self._buffer(obj, path)
            return buf.numel() * buf.element_size()
        if isinstance(obj, dict):
            return sum(self.reserve(v, f"{path}/{k}") for k, v in obj.items())
        if isinstance(obj, (list, tuple)):
            return sum(self.reserve(v, f"{path}/{i}") for i, v in enumerate(obj))
        return 0

    def stage(self, obj: Any, path: str = "") -> Any:
        if isinstance(obj, torch.Tensor):
            if obj.device.type == "cpu":
                return obj.detach().clone()
            buf = self._buffer(obj, path)
            buf.copy_(obj.detach(), non_blocking=True)
            return buf
        if isinstance(obj, dict):
            return {k: self.stage(v, f"{path}/{k}") for k, v in obj.items()}
        if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a namedtuple takes fields, not one iterable
            return type(obj)(*(self.stage(v, f"{path}/{i}") for i, v in enumerate(obj)))
        if isinstance(obj, (list, tuple)):
            return type(obj)(self.stage(v, f"{path}/{i}") for i, v in enumerate(obj))
        return obj


class Checkpointing(ResumeState):
    """Saves checkpoints (and, as a :class:`ResumeState`, carries RNG and data position in them).

    Args:
        dir: directory or fsspec URL (see :class:`CheckpointStore`).
        every_n_steps / every_n_minutes: save triggers (either, both or neither).
        save_last: save when training ends.
        keep_last_k: checkpoints kept in ``dir`` (older ones are deleted after a newer one is
            complete; 0 keeps all).
        async_write: write off the training thread (``ckpt=async``).
        storage_options: fsspec credentials/options (never recorded).
        clock: seconds for ``every_n_minutes`` (a monotonic clock; tests pass their own).

    A save's blocking time is also timed on the step clock of the trainer's
    :class:`~drivebench.perf.callback.StepTimer` (``use_step_clock``), which books it as checkpoint
    time rather than data wait.
    """

    def __init__(self, dir: str, every_n_steps: int | None = None, every_n_minutes: float | None = None,
                 save_last: bool = True, keep_last_k: int = 2, async_write: bool = False,
                 storage_options: dict[str, Any] | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        if every_n_steps is not None and (isinstance(every_n_steps, bool) or every_n_steps < 1):
            raise ConfigError(f"ckpt.every_n_steps={every_n_steps} is not valid; use a whole number >= 1 or null")
        if every_n_minutes is not None and every_n_minutes <= 0:
            raise ConfigError(f"ckpt.every_n_minutes={every_n_minutes} is not valid; use minutes > 0 or null")
        if keep_last_k < 0:
            raise ConfigError(f"ckpt.keep_last_k={keep_last_k} is not valid; use a whole number >= 0 (0 keeps all)")
        self.store = CheckpointStore(dir, storage_options)
        install_log_redaction(secret_values(storage_options or {}))  # a library may quote them in a log line
        self.every_n_steps = every_n_steps
        self.every_n_minutes = every_n_minutes
        self.save_last = save_last
        self.keep_last_k = keep_last_k
        self.async_write = async_write
        self.saves: list[dict[str, Any]] = []  # completed writes, in order
        self._logged = 0
        self._executor: ThreadPoolExecutor | None = None
        self._future: Future | None = None
        self._stager = HostStager()
        self.staging_reserved: dict[str, Any] | None = None  # async: pinned buffers made before the first save
        self.clock = clock
        self.step_clock = StepClock()  # off until a StepTimer hands over its own
        self._last_save_time = clock()
        self._last_saved_step = -1
        self._fault_step = int(os.environ[FAULT_ENV]) if os.environ.get(FAULT_ENV) else None

    def use_step_clock(self, clock: StepClock | None) -> None:
        self.step_clock = clock if clock is not None else StepClock()

    # ---- setup: preflight --------------------------------------------------------------------
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Before the first step: ckpt.dir exists, takes a write, and (locally) has room."""
        if stage != "fit" or not trainer.is_global_zero:
            return
        param_bytes = sum(p.numel() * p.element_size() for p in pl_module.parameters())
        # weights + two Adam moments, per kept checkpoint plus the one being written
        self.store.prepare(3 * param_bytes * (max(self.keep_last_k, 1) + 1))

    # ---- triggers ----------------------------------------------------------------------------
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._last_save_time = self.clock()  # every_n_minutes counts training time, not set-up

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)  # the data position
        self._log_completed(trainer)  # async writes that finished since the last step
        if self.async_write and self.staging_reserved is None and trainer.is_global_zero:
            self._reserve_staging(trainer, pl_module)
        done = batch_idx + 1
        per_epoch = trainer.num_training_batches
        if done % trainer.accumulate_grad_batches and not (isinstance(per_epoch, int) and done >= per_epoch):
            return  # mid-accumulation: the gradients summed so far would not be in the checkpoint
        step = trainer.global_step
        due = bool(self.every_n_steps and step % self.every_n_steps == 0)
        if self.every_n_minutes and self.clock() - self._last_save_time >= 60 * self.every_n_minutes:
            due = True
        if due and step != self._last_saved_step:
            self.save(trainer)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        try:
            if self.save_last and trainer.global_step != self._last_saved_step:
                self.save(trainer)
        finally:
            self.finish()
        self._log_completed(trainer)

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        # let a write in flight complete so the newest checkpoint on disk is the newest possible
        if self._future is not None:
            try:
                self._future.result()
            except Exception:
                pass

    def on_load_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(trainer, pl_module, checkpoint)
        self._last_saved_step = int(checkpoint.get("global_step", -1))  # already on disk: no save_last

    # ---- saving ------------------------------------------------------------------------------
    def _reserve_staging(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """After the first optimizer step (Adam's moments exist from then on): the host buffers for
        the checkpoint's device tensors, laid out as ``dump_checkpoint`` lays them out."""
        t0 = time.perf_counter()
        nbytes = self._stager.reserve({"state_dict": pl_module.state_dict(),
                                       "optimizer_states": [opt.state_dict() for opt in trainer.optimizers]})
        self.staging_reserved = {"bytes": nbytes, "seconds": time.perf_counter() - t0, "step": trainer.global_step}

    def save(self, trainer: pl.Trainer) -> None:
        """Checkpoint the training state now. Blocking time: everything until training may go on
        (sync: the whole write; async: waiting for the previous write, then the copy to the host)."""
        step = trainer.global_step
        self._last_saved_step = step
        self._last_save_time = self.clock()
        if not trainer.is_global_zero:
            return
        name = checkpoint_name(step)
        t0 = time.perf_counter()
        with self.step_clock.span(CKPT):
            self._raise_pending()  # waits for a write still in flight: that wait is blocking time
            checkpoint = trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
            fault = self._fault if self._fault_step == step else None
            if self.async_write:
                staged = self._stager.stage(checkpoint)
                if torch.cuda.is_available():
                    torch.cuda.synchronize()  # the copies into pinned buffers are asynchronous
                if self._executor is None:
                    self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="drivebench-ckpt")
                blocking = time.perf_counter() - t0
                self._future = self._executor.submit(self._write, name, staged, step, blocking, fault)
            else:
                self._write(name, checkpoint, step, None, fault)
        if not self.async_write:
            self.saves[-1]["blocking_s"] = time.perf_counter() - t0
        self._log_completed(trainer)

    def _write(self, name: str, checkpoint: dict[str, Any], step: int, blocking: float | None,
               fault: Any) -> dict[str, Any]:
        """Write, record, prune (on the background thread in async mode)."""
        result = self.store.write(name, checkpoint, fault)
        record = {"step": step, "path": result.path, "bytes": result.bytes, "blocking_s": blocking,
                  "write_s": result.write_s,
                  "mb_per_s": result.bytes / 2**20 / result.write_s if result.write_s > 0 else None,
                  "async": self.async_write}
        self.saves.append(record)
        self._prune()
        return record

    def _prune(self) -> None:
        """Delete all but the newest ``keep_last_k`` complete checkpoints (only after a new one is complete)."""
        if not self.keep_last_k:
            return
        steps = self.store.list_steps()
        for _, path in steps[: max(len(steps) - self.keep_last_k, 0)]:
            self.store.delete(path)

    def _raise_pending(self) -> None:
        if self._future is None:
            return
        future, self._future = self._future, None
        future.result()  # re-raises CheckpointWriteError from the background thread

    def finish(self) -> None:
        """Wait for a write in flight; raise its error if it failed."""
        try:
            self._raise_pending()
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None

    def _fault(self, partial_path: str, total_bytes: int) -> None:
        log.warning("fault injection: killing this process half-way through writing %s", partial_path)
        os.kill(os.getpid(), signal.SIGKILL)

    def _log_completed(self, trainer: pl.Trainer) -> None:
        """Log every completed save not logged yet, at the step it was taken (an async write
        completes later, so its figures are logged at a later hook, under its own step)."""
        if trainer.logger is None or not trainer.is_global_zero:
            return
        done = self.saves[self._logged:]
        self._logged += len(done)
        for record in done:
            metrics = {"perf/ckpt_blocking_s": record["blocking_s"], "perf/ckpt_write_s": record["write_s"],
                       "perf/ckpt_mb": record["bytes"] / 2**20}
            if record["mb_per_s"]:
                metrics["perf/ckpt_mb_per_s"] = record["mb_per_s"]
            trainer.logger.log_metrics(metrics, step=record["step"])

    # ---- summary -----------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        return {
            "dir": self.store.url,
            "filesystem": self.store.describe(),
            "async": self.async_write,
            "staging_reserved": self.staging_reserved,
            "saves": len(self.saves),
            "blocking_s": describe(s["blocking_s"] for s in self.saves if s.get("blocking_s") is not None),
            "write_s": describe(s["write_s"] for s in self.saves),
            "every_n_steps": self.every_n_steps,
            "every_n_minutes": self.every_n_minutes,
            "keep_last_k": self.keep_last_k,
            "bytes": self.saves[-1]["bytes"] if self.saves else None,
            "mb_per_s": describe(s["mb_per_s"] for s in self.saves if s["mb_per_s"]),
            "each": self.saves,
        }
