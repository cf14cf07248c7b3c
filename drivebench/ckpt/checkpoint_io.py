"""Checkpoint files as a Lightning ``CheckpointIO`` plugin: where they go, how they are written, and
what each write cost.

Lightning hands every checkpoint it takes (``trainer.save_checkpoint``, called by the
:class:`drivebench.ckpt.callback.Checkpointing` trigger) to the Trainer's checkpoint IO, and reads
``trainer.fit(ckpt_path=...)`` through it. This one:

* writes through a :class:`drivebench.ckpt.store.CheckpointStore` (a local directory with atomic
  rename, or any fsspec URL with its ``storage_options``), and reads through one, so a remote
  checkpoint is loaded with the credentials of ``ckpt.dir`` without a local copy;
* synchronously (``ckpt=local``/``remote``: the whole write is blocking time) or asynchronously
  (``ckpt=async``): every tensor is copied off the training state (device tensors into page-locked
  host buffers reserved once and reused, no second copy on the device), then one background thread
  serialises and writes the copy; a failed background write is raised at the next save or by
  :meth:`finish`;
* names every checkpoint after its run (:mod:`drivebench.ckpt.identity`: ``step-<step>-<fingerprint>-<run
  id>.ckpt``), puts the identity into it (``drivebench_run``), and prunes only this run's files: the newest
  ``keep_last_k`` of them are kept (pruned after each completed write), other runs' files are never touched;
* holds ``ckpt.dir`` for this run while it trains (:meth:`claim`: an exclusive lock on
  ``<ckpt.dir>/.drivebench.lock``): a second live run on the same local directory is refused in one line;
* records every save (bytes, write seconds, MiB/s, and the blocking seconds measured by
  :meth:`blocking`, the one place that times a save) for the run summary.

Lightning calls ``save_checkpoint`` on global rank 0 only (DDP replicas hold the same state).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from lightning.fabric.plugins import CheckpointIO

from drivebench.ckpt.identity import IDENTITY_KEY, RunIdentity
from drivebench.ckpt.store import CheckpointStore, CheckpointWriteError, checkpoint_name, store_for
from drivebench.errors import ConfigError
from drivebench.locks import HeldLock, LockBusy, hold_lock
from drivebench.perf.clock import CKPT, StepClock
from drivebench.perf.stats import describe
from drivebench.secrets import install_log_redaction, secret_values

log = logging.getLogger(__name__)
FAULT_ENV = "DRIVEBENCH_FAULT_KILL_DURING_CKPT_STEP"  # test hook: SIGKILL half-way through this step's write
LOCK_NAME = ".drivebench.lock"  # in ckpt.dir: held by the live run that writes there


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


class StorageCheckpointIO(CheckpointIO):
    """Args:
        dir: directory or fsspec URL of this run's checkpoints (see :class:`CheckpointStore`);
            None: no checkpoints are written (``ckpt=none``), only read (``resume=<path>``).
        keep_last_k: complete checkpoints kept in ``dir`` (0 keeps all).
        async_write: write off the training thread (``ckpt=async``).
        storage_options: fsspec credentials/options (never recorded); also used to read a
            ``resume`` checkpoint on the same filesystem.
    """

    def __init__(self, dir: str | None = None, keep_last_k: int = 2, async_write: bool = False,
                 storage_options: dict[str, Any] | None = None) -> None:
        if keep_last_k < 0:
            raise ConfigError(f"ckpt.keep_last_k={keep_last_k} is not valid; use a whole number >= 0 (0 keeps all)")
        self.storage_options = dict(storage_options or {})
        install_log_redaction(secret_values(self.storage_options))  # a library may quote them in a log line
        self.store = CheckpointStore(dir, self.storage_options) if dir else None
        self.keep_last_k = keep_last_k
        self.async_write = async_write
        self.saves: list[dict[str, Any]] = []  # completed writes, in order
        self.staging_reserved: dict[str, Any] | None = None  # async: pinned buffers made before the first save
        self._stager = HostStager()
        self._executor: ThreadPoolExecutor | None = None
        self._future: Future | None = None
        self._taken: dict[str, Any] | None = None  # the record of the save being taken (see ``blocking``)
        self.step_clock = StepClock()  # off until a StepTimer hands over its own (use_step_clock)
        self._fault_step = int(os.environ[FAULT_ENV]) if os.environ.get(FAULT_ENV) else None
        self.identity: RunIdentity | None = None  # set by the bench (bind); None: unnamed files, all one's own
        self._lock: HeldLock | None = None

    # ---- whose ---------------------------------------------------------------------------------
    def bind(self, identity: RunIdentity) -> None:
        """The run these checkpoints belong to: their names, their ``drivebench_run`` entry, what is pruned."""
        self.identity = identity

    def claim(self) -> None:
        """Hold ``ckpt.dir`` for this run until :meth:`teardown` (a local directory; the kernel releases the
        lock if the process dies). Refuses, in one line, a directory another live run holds. Removes this
        run's own ``.partial`` leftovers (a killed earlier process of the same run wrote them)."""
        store = self._store()
        if not store.local or self._lock is not None:
            return
        assert store.path is not None
        holder = (f"pid {os.getpid()} on {socket.gethostname()}, run {self.identity.run_id if self.identity else '-'}, "
                  f"since {time.strftime('%Y-%m-%d %H:%M:%S')}")
        try:
            self._lock = hold_lock(store.path / LOCK_NAME, holder)
        except LockBusy as busy:
            raise ConfigError(
                f"ckpt.dir={store.path} is in use by another live run ({busy.holder or 'holder unknown'}); two runs "
                "writing one directory would overwrite each other's checkpoints. Give this run its own "
                "ckpt.dir=<directory>, or wait for that run to end") from None
        if self.identity is not None:
            mine = f"-{self.identity.short}-{self.identity.run_id}.ckpt."
            for leftover in store.path.glob(".step-*.partial"):
                if mine in leftover.name:
                    leftover.unlink(missing_ok=True)

    def release(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    # ---- where -------------------------------------------------------------------------------
    def path_for(self, step: int) -> str:
        """The path or URL of the checkpoint of global step ``step`` in this run's store."""
        return self._store().path_of(checkpoint_name(step, self.identity))

    def _store(self) -> CheckpointStore:
        if self.store is None:
            raise ConfigError("ckpt=none writes no checkpoints; choose ckpt=local, async or remote to save")
        return self.store

    # ---- Lightning's CheckpointIO ------------------------------------------------------------
    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        """Write ``checkpoint`` (Lightning's dump) to ``path`` in the store: now, or, asynchronously,
        after copying it off the training state. ``storage_options``: the store's own are used."""
        store = self._store()
        name = Path(str(path)).name
        if store.path_of(name) != str(path):
            raise ValueError(f"checkpoint path {path} is not in ckpt.dir={store.url}")
        self._raise_pending()  # waits for a write still in flight: that wait is blocking time
        step = int(checkpoint.get("global_step", -1))
        if self.identity is not None:
            checkpoint[IDENTITY_KEY] = self.identity.to_dict()
        record: dict[str, Any] = {"step": step, "path": None, "bytes": None, "blocking_s": None, "write_s": None,
                                  "mb_per_s": None, "async": self.async_write}
        self._taken = record
        fault = self._fault if self._fault_step == step else None
        if not self.async_write:
            self._write(name, checkpoint, record, fault)
            return
        staged = self._stager.stage(checkpoint)
        if torch.cuda.is_available():
            torch.cuda.synchronize()  # the copies into pinned buffers are asynchronous
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="drivebench-ckpt")
        self._future = self._executor.submit(self._write, name, staged, record, fault)

    def load_checkpoint(self, path: Any, map_location: Any = None, weights_only: bool | None = None) -> dict[str, Any]:
        """Read a checkpoint onto the CPU (``weights_only=True`` unless Lightning asks otherwise), from a
        local path or a URL (with ``ckpt.storage_options`` on the same filesystem)."""
        path = str(path)
        if path.startswith("file://"):
            path = path[len("file://"):]
        return store_for(path, self.store).load(path, weights_only=True if weights_only is None else weights_only)

    def remove_checkpoint(self, path: Any) -> None:
        self._store().delete(str(path))

    def teardown(self) -> None:
        """Lightning's end of a run: let a write in flight complete (its error, if any, was or will
        be raised by :meth:`finish`)."""
        try:
            self.finish()
        except Exception as err:  # noqa: BLE001 - already raised to the training loop by finish()
            log.debug("checkpoint write failed (raised earlier): %s", err)
        finally:
            self.release()

    # ---- the blocking time of a save ---------------------------------------------------------
    def use_step_clock(self, clock: StepClock | None) -> None:
        """Book each save's blocking time on ``clock`` (the training phase's), or on an off one."""
        self.step_clock = clock if clock is not None else StepClock()

    @contextlib.contextmanager
    def blocking(self) -> Iterator[None]:
        """Time what training waits for around ``trainer.save_checkpoint`` (Lightning's dump, waiting
        for a previous write, the write or the copy to the host): booked as the step's ``ckpt`` span,
        and, on the rank that writes, as the save's ``blocking_s``. The one place a save is timed."""
        self._taken = None
        t0 = time.perf_counter()
        with self.step_clock.span(CKPT):
            yield
        if self._taken is not None:
            self._taken["blocking_s"] = time.perf_counter() - t0
            self._taken = None

    def reserve_staging(self, state: dict[str, Any], step: int) -> None:
        """Async: the host buffers for ``state`` (the checkpoint's device tensors, laid out as
        Lightning's dump lays them out), allocated before the first save so that it does not pay
        for page-locking them."""
        if not self.async_write or self.staging_reserved is not None:
            return
        t0 = time.perf_counter()
        nbytes = self._stager.reserve(state)
        self.staging_reserved = {"bytes": nbytes, "seconds": time.perf_counter() - t0, "step": step}

    # ---- writing -----------------------------------------------------------------------------
    def _write(self, name: str, checkpoint: dict[str, Any], record: dict[str, Any],
               fault: Callable[[str, int], None] | None) -> dict[str, Any]:
        """Write, record, prune (on the background thread in async mode)."""
        try:
            result = self._store().write(name, checkpoint, fault)
        except CheckpointWriteError as err:
            raise err.with_advice(self.continue_advice(err)) from err.__cause__
        record.update(path=result.path, bytes=result.bytes, write_s=result.write_s,
                      mb_per_s=result.bytes / 2**20 / result.write_s if result.write_s > 0 else None)
        self.saves.append(record)
        self._prune()
        return record

    def continue_advice(self, err: CheckpointWriteError) -> str:
        """What to do after a failed write, made true: which checkpoint to continue from, and how."""
        try:
            previous = [f for f in self._store().list_checkpoints() if f.belongs_to(self.identity)]
        except Exception:  # noqa: BLE001 - the storage that just failed may not list either
            previous = []
        fix = ("free space in ckpt.dir" if err.full else
               "check the storage (space, quota, credentials)" if err.remote else
               "check that ckpt.dir exists and is writable")
        if not previous:
            return (f"No checkpoint of this run was written yet: {fix}, or choose another ckpt.dir, and start "
                    "the run again")
        last = previous[-1].path
        return (f"To continue: {fix}, then rerun with resume=auto and the same ckpt.dir (it finds {last}), or "
                f"write elsewhere with ckpt.dir=<another directory> resume={last}")

    def _prune(self) -> None:
        """Delete all but the newest ``keep_last_k`` complete checkpoints of this run (only after a new one is
        complete); other runs' checkpoints in the same directory are not this run's to delete."""
        if not self.keep_last_k:
            return
        mine = [f for f in self._store().list_checkpoints() if f.belongs_to(self.identity)]
        for old in mine[: max(len(mine) - self.keep_last_k, 0)]:
            self.remove_checkpoint(old.path)

    def _raise_pending(self) -> None:
        if self._future is None:
            return
        future, self._future = self._future, None
        future.result()  # re-raises CheckpointWriteError from the background thread

    def wait(self) -> None:
        """Let a write in flight complete, ignoring its error (training is stopping on another one)."""
        if self._future is not None:
            try:
                self._future.result()
            except Exception:  # noqa: BLE001
                pass

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

    # ---- summary -----------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        store = self._store()
        return {
            "dir": store.url,
            "filesystem": store.describe(),
            "async": self.async_write,
            "staging_reserved": self.staging_reserved,
            "saves": len(self.saves),
            "blocking_s": describe(s["blocking_s"] for s in self.saves if s.get("blocking_s") is not None),
            "write_s": describe(s["write_s"] for s in self.saves),
            "keep_last_k": self.keep_last_k,
            "bytes": self.saves[-1]["bytes"] if self.saves else None,
            "mb_per_s": describe(s["mb_per_s"] for s in self.saves if s["mb_per_s"]),
            "each": self.saves,
        }
