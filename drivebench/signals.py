"""Stopping a run on SIGTERM, SIGINT or SIGUSR1: at a step boundary, with a checkpoint, a summary and an exit code.

Why: a cluster stops a job with a signal (Kubernetes and SLURM preemption: SIGTERM, then SIGKILL after a
grace period; SLURM's warning before the time limit: SIGUSR1 with ``--signal``; a terminal: SIGINT).
Python's defaults end the process at once (SIGTERM, SIGUSR1) or raise KeyboardInterrupt wherever the
program is (SIGINT), and Lightning's own SIGTERM handling raises ``SIGTERMException``, a ``SystemExit``,
at the next batch, mid-accumulation included: a preempted job looked finished, with nothing saved.

:class:`SignalStop` owns the three signals while ``drivebench.app.main`` runs:

* during training (:class:`StopOnSignal` defers them) the first signal is only recorded; at the next
  optimizer-step boundary every rank agrees to stop (one boolean reduction per step under DDP), the
  checkpoint trigger writes a final checkpoint, the bench writes the summary with ``status: interrupted``;
* anywhere else (set-up, data preparation, the ceiling, validation), and for a second signal during
  training, it raises :class:`Interrupted` where the program is (as Python does for SIGINT).

``drivebench.app.main`` then prints one line and exits with ``128 + the signal number`` (the shell's
convention: 130 SIGINT, 143 SIGTERM, 138 SIGUSR1). With ``requeue=true`` under SLURM, a SIGUSR1 stop
also requeues the job (``scontrol requeue``) once the checkpoint and the summary are written.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
from types import FrameType
from typing import Any, Callable

import lightning.pytorch as pl

log = logging.getLogger(__name__)

STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


def leave_stop_signals_to_the_parent() -> None:
    """In a DataLoader worker: ignore :data:`STOP_SIGNALS`, which the training process handles.

    Why: schedulers and terminals signal a whole process group (GNU ``timeout``, ``kill -TERM -<pgid>``,
    SLURM's ``scancel`` of a step, Ctrl-C), and torch's workers die on a SIGTERM from anyone but their
    parent (its handler re-raises the default) or end on SIGINT (KeyboardInterrupt). The training process
    then lost its loader mid-step and stopped with an error instead of at the next step boundary (seen on
    the H200, b37: a capped run ended without its last validation scalars). A worker still ends when the
    training process shuts its loader down or dies (torch's worker watches its parent)."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)


def exit_code(signum: int) -> int:
    """The process's exit status after a stop on ``signum``: 128 + its number (130, 143, 138)."""
    return 128 + int(signum)


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


class Interrupted(BaseException):
    """The run stopped on a signal. A ``BaseException`` (as KeyboardInterrupt is): raised from a signal
    handler, it must not be swallowed by a library's ``except Exception``.

    Args:
        signum: the signal.
        message: what happened, for the one line ``drivebench.app.main`` prints (filled in by the bench).
    """

    def __init__(self, signum: int, message: str | None = None) -> None:
        super().__init__(signum, message)
        self.signum = int(signum)
        self.message = message

    @property
    def exit_code(self) -> int:
        return exit_code(self.signum)

    def line(self) -> str:
        what = self.message or "before training reached a step boundary; no summary was written"
        return f"drivebench: stopped by {signal_name(self.signum)} {what} (exit status {self.exit_code})"


class SignalStop:
    """The process's handler for :data:`STOP_SIGNALS` (one instance, :data:`STOP`)."""

    def __init__(self) -> None:
        self.received: int | None = None    # the first stop signal of this run (in this process)
        self.count = 0                      # stop signals this process received in this run
        self.agreed: int | None = None      # a stop every rank agreed on (a peer may have received it)
        self.deferring = 0                  # > 0 while a training phase stops at its next step boundary
        self.forward_to: list[Callable[[], list[subprocess.Popen]]] = []  # rank processes launched here
        self._previous: dict[int, Any] = {}
        self._pid: int | None = None
        self._forwarded: set[int] = set()

    # ---- install / restore -------------------------------------------------------------------
    def install(self) -> None:
        """Take the stop signals for this process (main thread only; elsewhere nothing is changed)."""
        if threading.current_thread() is not threading.main_thread():
            return
        self.received = self.agreed = None
        self.count = 0
        self.deferring = 0
        self._forwarded = set()
        self._pid = os.getpid()
        for signum in STOP_SIGNALS:
            self._previous.setdefault(signum, signal.getsignal(signum))
            signal.signal(signum, self._handle)

    def reinstall(self) -> None:
        """Take the signals back from a library that replaced the handlers (Lightning's Trainer
        installs its SIGTERM handler at the start of every ``fit``); restored by its teardown."""
        if self._pid == os.getpid() and threading.current_thread() is threading.main_thread():
            for signum in STOP_SIGNALS:
                signal.signal(signum, self._handle)

    def restore(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum, handler in self._previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        self._previous = {}
        self._pid = None

    def resurface(self) -> None:
        """Raise again a stop whose :class:`Interrupted` never arrived: raised inside a hook that ignores
        exceptions (logging's at-fork hook while a loader forks its workers: Python prints "Exception ignored"
        and goes on), the signal was recorded but the program carried on until the scheduler's SIGKILL (the
        H100, b48: a capped run's end-of-run validation, killed 20 s later with no summary). Called at every
        batch start (:class:`RaiseLostStop` in the bench's Trainers; the loader benchmark's loop); nothing while a
        training phase defers the stop to its step boundary."""
        if self.received is not None and not self.deferring and self._pid == os.getpid():
            raise Interrupted(self.received)

    def stopping(self) -> int | None:
        """The signal this run is stopping on (received here or agreed with the other ranks), or None."""
        return self.received or self.agreed

    # ---- the handler -------------------------------------------------------------------------
    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self._pid:
            return  # a forked process (a pool worker; a loader worker before its worker_init_fn ignores these)
        self.count += 1
        first = self.received is None
        if first:
            self.received = signum
        self._forward(signum)
        if first and self.deferring:
            log.warning("%s received: training stops at the next step boundary (a final checkpoint is written "
                        "when checkpoints are on); send it again to stop at once", signal_name(signum))
            return
        raise Interrupted(signum)

    def _forward(self, signum: int) -> None:
        """Pass the signal on to the rank processes this process launched (a scheduler may have signalled
        only this one), once per signal."""
        if signum in self._forwarded:
            return
        self._forwarded.add(signum)
        for source in self.forward_to:
            for proc in source():
                if proc.poll() is None:
                    try:
                        proc.send_signal(signum)
                    except OSError:
                        pass


STOP = SignalStop()


class StopOnSignal(pl.Callback):
    """Stops training at the first optimizer-step boundary after a stop signal, on every rank at the same step
    (the end of a validation during ``fit`` is one: it follows an optimizer step).

    The checkpoint trigger (:class:`drivebench.ckpt.callback.Checkpointing`) writes the final checkpoint in
    ``on_train_end`` when :attr:`stopped` is set; validation during ``fit`` is switched off for that last
    step (Lightning would otherwise run one when ``should_stop`` is set)."""

    def __init__(self, stop: SignalStop = STOP) -> None:
        self.stop = stop
        self.stopped: dict[str, Any] | None = None  # {"signal", "signum", "step"} once training stopped on one
        self._deferring = False

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.stop.reinstall()  # after Lightning's own SIGTERM handler (SIGTERMException mid-accumulation)
        self.stop.deferring += 1
        self._deferring = True

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self.stopped is None and at_optimizer_step_boundary(trainer, batch_idx):
            self._stop_if_signalled(trainer)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """A signal received while validating during ``fit`` stops training here, not after the next training
        step, which can take longer than a scheduler's grace (a new epoch's loader, a CUDA graph capture; b44,
        H100: a capped run got SIGTERM in its epoch-4 validation and SIGKILL 5 s later, with no summary)."""
        if not self._deferring or trainer.sanity_checking or self.stopped is not None:
            return
        done = trainer.fit_loop.epoch_loop.batch_progress.current.ready  # batches of this epoch so far
        if done and at_optimizer_step_boundary(trainer, done - 1):
            self._stop_if_signalled(trainer)

    def _stop_if_signalled(self, trainer: pl.Trainer) -> None:
        mine = self.stop.received
        if trainer.world_size > 1:
            # every rank must stop at the same step (the save and DDP's collectives): the first rank to
            # have received a signal decides; which one it was is agreed below
            code = int(mine or 0)
            agreed = int(trainer.strategy.reduce(_tensor(code, trainer), reduce_op="max").item())
        else:
            agreed = int(mine or 0)
        if not agreed:
            return
        self.stop.agreed = agreed
        self.stopped = {"signal": signal_name(agreed), "signum": agreed, "step": trainer.global_step}
        trainer.should_stop = True
        trainer.limit_val_batches = 0  # no validation on the way out: the signal gives limited time

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._leave()

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._leave()

    def _leave(self) -> None:
        if self._deferring:
            self.stop.deferring -= 1
            self._deferring = False

    @staticmethod
    def of(trainer: pl.Trainer) -> "StopOnSignal | None":
        return next((cb for cb in trainer.callbacks if isinstance(cb, StopOnSignal)), None)


class RaiseLostStop(pl.Callback):
    """At every training and validation batch start, raises a stop signal's :class:`Interrupted` that a hook
    swallowed (:meth:`SignalStop.resurface`): every Trainer the bench builds carries one, so a lost stop ends
    the run within a batch."""

    def __init__(self, stop: SignalStop = STOP) -> None:
        self.stop = stop

    def on_train_batch_start(self, *args: Any) -> None:
        self.stop.resurface()

    def on_validation_batch_start(self, *args: Any) -> None:
        self.stop.resurface()


def _tensor(value: int, trainer: pl.Trainer) -> Any:
    import torch

    return torch.tensor(value, device=trainer.strategy.root_device)


def at_optimizer_step_boundary(trainer: pl.Trainer, batch_idx: int) -> bool:
    """True after a batch whose optimizer step ran (not mid-accumulation: the gradients summed so far
    are in no checkpoint)."""
    done = batch_idx + 1
    per_epoch = trainer.num_training_batches
    return not (done % trainer.accumulate_grad_batches) or (isinstance(per_epoch, int) and done >= per_epoch)


# ---- SLURM requeue (``requeue=true``) ---------------------------------------------------------------
def slurm_job_id(environ: dict[str, str] | None = None) -> str | None:
    """The id ``scontrol requeue`` takes: ``<array job>_<task>`` for an array task, else SLURM_JOB_ID."""
    env = os.environ if environ is None else environ
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        return f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    return env.get("SLURM_JOB_ID") or None


def requeue_slurm_job(environ: dict[str, str] | None = None) -> str:
    """``scontrol requeue <job>``; returns what happened, in words (for the summary and the one line)."""
    job = slurm_job_id(environ)
    if job is None:
        return "not requeued: not a SLURM job (SLURM_JOB_ID is not set)"
    try:
        result = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"requeue of SLURM job {job} failed: {err}"
    if result.returncode != 0:
        why = (result.stderr or result.stdout).strip().splitlines()
        return f"requeue of SLURM job {job} failed (scontrol exit {result.returncode}: {why[0] if why else 'no output'})"
    return f"SLURM job {job} requeued"
