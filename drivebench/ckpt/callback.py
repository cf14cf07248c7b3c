"""Checkpointing during training: when to save, synchronously or off the training thread, and
what a save costs.

A save snapshots the Lightning checkpoint (model, optimizer, scheduler, loops, callbacks) plus
drivebench's own state: RNG states of every generator and the data position (epoch, batches done),
so that ``resume`` continues the same sample stream and the same dropout masks.

* synchronous (``ckpt=local``/``remote``): serialise and write on the training thread; the whole
  write is blocking time.
* asynchronous (``ckpt=async``): copy every tensor off the device into reused page-locked host
  buffers (no second copy on the device), then serialise and write on a background thread; only
  the copy (and waiting for a previous write still in flight) blocks. A failed background write is
  raised at the next save or at the end of training.

Only global rank 0 writes (DDP replicas hold the same state).
"""

from __future__ import annotations

import logging
import os
import random
import signal
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch

from drivebench.ckpt.store import CheckpointStore, WriteResult, checkpoint_name
from drivebench.errors import ConfigError
from drivebench.perf.spans import SPANS
from drivebench.perf.stats import describe

log = logging.getLogger(__name__)
STATE_KEY = "drivebench"
FAULT_ENV = "DRIVEBENCH_FAULT_KILL_DURING_CKPT_STEP"  # test hook: SIGKILL half-way through this step's write


def rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class _HostStager:
    """Copies a nested checkpoint's device tensors into page-locked host buffers reused across saves."""

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}

    def stage(self, obj: Any, path: str = "") -> Any:
        if isinstance(obj, torch.Tensor):
            if obj.device.type == "cpu":
                return obj.clone()
            buf = self._buffers.get(path)
            if buf is None or buf.shape != obj.shape or buf.dtype != obj.dtype:
                buf = torch.empty(obj.shape, dtype=obj.dtype, pin_memory=True)
                self._buffers[path] = buf
            buf.copy_(obj, non_blocking=True)
            return buf
        if isinstance(obj, dict):
            return {k: self.stage(v, f"{path}/{k}") for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return type(obj)(self.stage(v, f"{path}/{i}") for i, v in enumerate(obj))
        return obj


class Checkpointing(pl.Callback):
    """Args:
        dir: directory or fsspec URL (see :class:`CheckpointStore`).
        every_n_steps / every_n_minutes: save triggers (either, both or neither).
        save_last: save when training ends.
        keep_last_k: checkpoints kept in ``dir`` (older ones are deleted after a newer one is
            complete; 0 keeps all).
        async_write: write off the training thread (``ckpt=async``).
        storage_options: fsspec credentials/options (never recorded).
    """

    def __init__(self, dir: str, every_n_steps: int | None = None, every_n_minutes: float | None = None,
                 save_last: bool = True, keep_last_k: int = 2, async_write: bool = False,
                 storage_options: dict[str, Any] | None = None) -> None:
        if every_n_steps is not None and (isinstance(every_n_steps, bool) or every_n_steps < 1):
            raise ConfigError(f"ckpt.every_n_steps={every_n_steps} is not valid; use a whole number >= 1 or null")
        if every_n_minutes is not None and every_n_minutes <= 0:
            raise ConfigError(f"ckpt.every_n_minutes={every_n_minutes} is not valid; use minutes > 0 or null")
        if keep_last_k < 0:
            raise ConfigError(f"ckpt.keep_last_k={keep_last_k} is not valid; use a whole number >= 0 (0 keeps all)")
        self.store = CheckpointStore(dir, storage_options)
        self.every_n_steps = every_n_steps
        self.every_n_minutes = every_n_minutes
        self.save_last = save_last
        self.keep_last_k = keep_last_k
        self.async_write = async_write
        self.saves: list[dict[str, Any]] = []
        self._executor: ThreadPoolExecutor | None = None
        self._future: Future | None = None
        self._stager = _HostStager()
        self._last_save_time = time.monotonic()
        self._last_saved_step = -1
        self._data_position: tuple[int, int] = (0, 0)
        self._fault_step = int(os.environ[FAULT_ENV]) if os.environ.get(FAULT_ENV) else None

    # ---- setup: preflight --------------------------------------------------------------------
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        needed = None
        if trainer.is_global_zero:
            param_bytes = sum(p.numel() * p.element_size() for p in pl_module.parameters())
            # weights + two Adam moments, per kept checkpoint plus the one being written
            needed = 3 * param_bytes * (max(self.keep_last_k, 1) + 1)
            self.store.prepare(needed)

    # ---- triggers ----------------------------------------------------------------------------
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        self._data_position = (trainer.current_epoch, batch_idx + 1)
        step = trainer.global_step
        due = bool(self.every_n_steps and step % self.every_n_steps == 0)
        if self.every_n_minutes and time.monotonic() - self._last_save_time >= 60 * self.every_n_minutes:
            due = True
        if due and step != self._last_saved_step:
            self.save(trainer)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._data_position = (trainer.current_epoch + 1, 0)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        try:
            if self.save_last and trainer.global_step != self._last_saved_step:
                self.save(trainer)
        finally:
            self.finish()

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        # let a write in flight complete so the newest checkpoint on disk is the newest possible
        if self._future is not None:
            try:
                self._future.result()
            except Exception:
                pass

    # ---- state carried inside the checkpoint -------------------------------------------------
    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        checkpoint[STATE_KEY] = {"rng": rng_state(), "data_position": self._data_position,
                                 "global_step": trainer.global_step}

    def on_load_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        state = checkpoint.get(STATE_KEY)
        if not state:
            return
        set_rng_state(state["rng"])
        epoch, done = state["data_position"]
        datamodule = trainer.datamodule
        if datamodule is not None and hasattr(datamodule, "resume_at"):
            datamodule.resume_at(epoch, done)
        self._last_saved_step = state.get("global_step", -1)

    # ---- saving ------------------------------------------------------------------------------
    def save(self, trainer: pl.Trainer) -> None:
        step = trainer.global_step
        self._last_saved_step = step
        self._last_save_time = time.monotonic()
        if not trainer.is_global_zero:
            return
        name = checkpoint_name(step)
        t0 = time.perf_counter()
        with SPANS.span("ckpt"):
            self._raise_pending()  # waits for a write still in flight: that wait is blocking time
            checkpoint = trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
            fault = self._fault if self._fault_step == step else None
            if self.async_write:
                staged = self._stager.stage(checkpoint)
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                if self._executor is None:
                    self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="drivebench-ckpt")
                submitted = time.perf_counter()
                blocking_so_far = submitted - t0
                self._future = self._executor.submit(self._write, name, staged, step, submitted, blocking_so_far,
                                                     fault)
                record = None
            else:
                result = self.store.write(name, checkpoint, fault)
                record = self._record(step, result)
        blocking = time.perf_counter() - t0
        if record is not None:
            record["blocking_s"] = blocking
            self._prune()
        self._log(trainer, blocking, record)

    def _write(self, name: str, staged: dict[str, Any], step: int, submitted: float, blocking: float,
               fault: Any) -> dict[str, Any]:
        result = self.store.write(name, staged, fault)
        record = self._record(step, result)
        record["blocking_s"] = blocking
        record["write_s"] = time.perf_counter() - submitted
        self._prune()
        return record

    def _record(self, step: int, result: WriteResult) -> dict[str, Any]:
        record = {"step": step, "path": result.path, "bytes": result.bytes, "write_s": result.write_s,
                  "mb_per_s": result.bytes / 2**20 / result.write_s if result.write_s > 0 else None,
                  "async": self.async_write}
        self.saves.append(record)
        return record

    def _prune(self) -> None:
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

    def _log(self, trainer: pl.Trainer, blocking: float, record: dict[str, Any] | None) -> None:
        if trainer.logger is None or not trainer.is_global_zero:
            return
        metrics = {"perf/ckpt_blocking_s": blocking}
        if record is not None:
            metrics["perf/ckpt_write_s"] = record["write_s"]
            if record["mb_per_s"]:
                metrics["perf/ckpt_mb_per_s"] = record["mb_per_s"]
        elif self.saves:  # async: the last completed background write
            last = self.saves[-1]
            metrics["perf/ckpt_write_s"] = last["write_s"]
            if last["mb_per_s"]:
                metrics["perf/ckpt_mb_per_s"] = last["mb_per_s"]
        trainer.logger.log_metrics(metrics, step=trainer.global_step)

    # ---- summary -----------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        return {
            "dir": self.store.url,
            "filesystem": self.store.describe(),
            "async": self.async_write,
            "saves": len(self.saves),
            "blocking_s": describe(s["blocking_s"] for s in self.saves if s.get("blocking_s") is not None),
            "write_s": describe(s["write_s"] for s in self.saves),
            "bytes": self.saves[-1]["bytes"] if self.saves else None,
            "mb_per_s": describe(s["mb_per_s"] for s in self.saves if s["mb_per_s"]),
            "each": self.saves,
        }
