"""Distributed runs on the engines users already have (Lightning DDP, torchrun, SLURM), made robust.

Three things go wrong with Lightning + Hydra + DDP out of the box (Lightning-AI #11300, #2727,
lightning-hydra-template #393); each is fixed here, narrowly:

1. Lightning re-launches rank processes with the parent's whole ``sys.argv``: under ``-m`` every
   rank would start the whole sweep again. :func:`patch_rank_launch_command` makes the children
   run exactly this job (its resolved overrides, no ``-m``) in this job's directory.
2. After one job of a multirun, the rank-0 process keeps ``LOCAL_RANK``/``MASTER_PORT``/... and an
   initialised process group; the next job would not launch its ranks and hang. :class:`DistJob`
   waits for the job's rank processes, destroys the process group and restores the environment.
3. Under torchrun every rank runs Hydra and would create its own timestamped output directory:
   :func:`external_rank_overrides` sends ranks > 0 to a scratch directory, so one run directory
   (rank 0's) holds the run; the summary gathers every rank's figures there.

A rank that dies must stop the run with its name, not leave the others waiting in a collective:
:class:`RankWatch` replaces Lightning's child-process observer (which logs only "child process
with PID ... terminated" at INFO level, then SIGKILLs the launcher) and names the dead rank.
``dist.p2p`` is applied to the environment before any process group exists (:func:`apply_p2p`).
"""

from __future__ import annotations

import atexit
import datetime as dt
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import torch

from drivebench.errors import ConfigError
from drivebench.exit_watchdog import stderr_line

log = logging.getLogger(__name__)

P2P_LEVELS = ("LOC", "NVL", "PIX", "PXB", "PHB", "SYS")
_DIST_ENV = ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "NCCL_P2P_DISABLE",
             "NCCL_P2P_LEVEL", "PL_GLOBAL_SEED")
# hydra.* overrides that a rank process needs to compose the same config as its launcher
_RANK_HYDRA_OVERRIDES = ("hydra.searchpath", "hydra.job.chdir")

# Fault injection (tests; rehearsing failure handling on a real machine): the global rank named by
# DRIVEBENCH_FAULT_EXIT_RANK leaves abruptly (os._exit, no cleanup, exit code 13) after training
# step DRIVEBENCH_FAULT_EXIT_STEP (default 2), as a rank killed by the OOM killer would; with
# DRIVEBENCH_FAULT_HANG=1 it stops responding instead (sleeps), as a stuck rank would.
FAULT_EXIT_RANK_ENV = "DRIVEBENCH_FAULT_EXIT_RANK"
FAULT_EXIT_STEP_ENV = "DRIVEBENCH_FAULT_EXIT_STEP"
FAULT_HANG_ENV = "DRIVEBENCH_FAULT_HANG"
FAULT_EXIT_CODE = 13


# ---- NCCL peer-to-peer ----------------------------------------------------------------------------
def apply_p2p(p2p: Any, cache_dir: str | None = None, environ: dict[str, str] | None = None) -> dict[str, Any]:
    """Set NCCL's peer-to-peer variables for ``dist.p2p`` and say what was applied.

    ``on``: P2P allowed (NCCL_P2P_DISABLE removed); ``off``: NCCL_P2P_DISABLE=1; a level (LOC, NVL,
    PIX, PXB, PHB, SYS): NCCL_P2P_LEVEL; ``auto``: the doctor's cached verdict if there is one,
    else NCCL's own default (the environment is left as it is). YAML reads a bare ``on``/``off``
    as a boolean, so true/false mean on/off.
    """
    env = os.environ if environ is None else environ
    requested = ("on" if p2p else "off") if isinstance(p2p, bool) else str(p2p)
    source = "config"
    value = _p2p_value(requested)
    if value == "auto":
        verdict = _cached_verdict(cache_dir)
        if verdict is None:
            return {"requested": requested, "applied": "nccl-default", "source": "nccl default (no doctor verdict)",
                    "env": _nccl_env(env)}
        value, source = _p2p_value(verdict), "doctor cache"
    if value == "on":
        env.pop("NCCL_P2P_DISABLE", None)
        env.pop("NCCL_P2P_LEVEL", None)
    elif value == "off":
        env["NCCL_P2P_DISABLE"] = "1"
        env.pop("NCCL_P2P_LEVEL", None)
    elif value in P2P_LEVELS:
        env.pop("NCCL_P2P_DISABLE", None)
        env["NCCL_P2P_LEVEL"] = value
    else:
        raise ConfigError(f"dist.p2p={requested!r} is not valid; choose one of: auto, on, off, {', '.join(P2P_LEVELS)}")
    return {"requested": requested, "applied": value, "source": source, "env": _nccl_env(env)}


def _p2p_value(text: str) -> str:
    return text.upper() if text.upper() in P2P_LEVELS else text.lower()


def _cached_verdict(cache_dir: str | None) -> str | None:
    if not cache_dir:
        return None
    try:
        from pathlib import Path

        from drivebench.hardware.p2p import cached_p2p_verdict

        return cached_p2p_verdict(Path(cache_dir))
    except Exception as err:  # a missing or unreadable cache is not an error
        log.debug("no cached P2P verdict: %s", err)
        return None


def _nccl_env(env: Any) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith("NCCL_")}


# ---- strategy and devices -------------------------------------------------------------------------
def build_strategy(dist_cfg: Any, accelerator: str) -> Any:
    """Lightning strategy for ``dist``: "auto" for one process, a configured DDPStrategy otherwise."""
    if dist_cfg.strategy != "ddp":
        return dist_cfg.strategy
    from lightning.pytorch.strategies import DDPStrategy

    backend = dist_cfg.get("backend") or ("nccl" if accelerator == "gpu" else "gloo")
    if backend == "nccl" and accelerator != "gpu":
        raise ConfigError("dist.backend=nccl needs GPUs but this run is on the CPU; use dist.backend=gloo "
                          "(or leave dist.backend unset)")
    if backend not in ("nccl", "gloo", "mpi"):
        raise ConfigError(f"dist.backend={backend!r} is not valid; choose one of: nccl, gloo, mpi")
    check_launch_env()
    timeout = dist_cfg.get("timeout_minutes", 10)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ConfigError(f"dist.timeout_minutes={timeout!r} is not valid; use a number of minutes > 0")
    return DDPStrategy(
        process_group_backend=backend,
        find_unused_parameters=bool(dist_cfg.find_unused_parameters),
        gradient_as_bucket_view=bool(dist_cfg.gradient_as_bucket_view),
        static_graph=bool(dist_cfg.static_graph),
        timeout=dt.timedelta(minutes=float(timeout)),
    )


def check_launch_env(environ: dict[str, str] | None = None) -> None:
    """A DDP run with LOCAL_RANK but no WORLD_SIZE: Lightning would wait for ranks nobody starts.

    ``LOCAL_RANK`` (or ``--local_rank``) tells Lightning that an external launcher created the rank
    processes; every launcher that does also sets ``WORLD_SIZE``. Without it the run would sit in
    the rendezvous until ``dist.timeout_minutes``.
    """
    env = os.environ if environ is None else environ
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return  # a later phase of a running job (ceiling, validation): its ranks exist, Lightning set LOCAL_RANK
    if "LOCAL_RANK" in env and "WORLD_SIZE" not in env:
        raise ConfigError(f"LOCAL_RANK={env['LOCAL_RANK']} is set (or --local_rank was given) but no launcher "
                          "started the other ranks (WORLD_SIZE is not set); unset LOCAL_RANK to let Lightning "
                          "start them, or launch with torchrun --nproc_per_node=N")


class TooFewDevices(ConfigError):
    """``dist.devices`` asks for more GPUs than this machine has (a sweep may skip such a job:
    ``experiment.unavailable_devices=skip``, :mod:`drivebench.scaling`)."""


def resolve_devices(dist_cfg: Any, num_gpus: int, accelerator: str) -> int:
    """Processes per node: ``dist.devices`` checked against this machine (auto = every GPU)."""
    devices = dist_cfg.devices
    if devices == "auto":
        return num_gpus if (accelerator == "gpu" and num_gpus) else (2 if dist_cfg.strategy == "ddp" else 1)
    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
        raise ConfigError(f"dist.devices={devices!r} is not valid; use a whole number >= 1 or auto")
    if accelerator == "gpu" and devices > num_gpus:
        raise TooFewDevices(f"dist.devices={devices} but this machine has {num_gpus} GPU(s); lower dist.devices "
                            f"(or use dist.devices=auto)")
    return devices


# ---- Hydra + Lightning's rank launcher -------------------------------------------------------------
def _rank_command(local_rank: int) -> tuple[list[str], str]:
    """The command Lightning's launcher runs for rank ``local_rank`` of this Hydra job."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.utils import get_original_cwd

    hc = HydraConfig.get()
    command = [sys.executable, "-m", "drivebench"]
    if hc.job.config_name and hc.job.config_name != "config":
        command += ["--config-name", hc.job.config_name]
    for source in hc.runtime.config_sources:
        if source.provider == "command-line":  # --config-dir given to the launcher
            command += ["--config-dir", source.path]
    command += [o for o in hc.overrides.hydra if o.split("=", 1)[0].lstrip("+~") in _RANK_HYDRA_OVERRIDES]
    command += list(hc.overrides.task)
    # quoted: a sweep's job directory may hold "=" or "," (override_dirname), which Hydra would parse
    command += [f'hydra.run.dir="{hc.runtime.output_dir}"', "hydra.output_subdir=null",
                f"hydra.job.name=rank{local_rank}", "hydra/job_logging=none", "hydra/hydra_logging=none"]
    return command, get_original_cwd()


def patch_rank_launch_command() -> None:
    """Make Lightning launch rank processes for this job only, watched by :class:`RankWatch`."""
    from lightning.fabric.strategies.launchers import subprocess_script as fabric_launcher
    from lightning.pytorch.strategies.launchers import subprocess_script as trainer_launcher

    for module in (fabric_launcher, trainer_launcher):  # the trainer's module imports both by name
        module._hydra_subprocess_cmd = _rank_command
        module._launch_process_observer = _watch_rank_processes


def external_rank_overrides(environ: dict[str, str] | None = None) -> list[str]:
    """Hydra overrides for ranks > 0 started by an external launcher (torchrun, srun).

    They run in a scratch directory (removed when they exit), so only rank 0 makes a run directory
    (or, under ``-m``, a sweep directory) under the outputs root.
    """
    env = os.environ if environ is None else environ
    rank = env.get("RANK") or env.get("SLURM_PROCID")
    if rank is None or int(rank) == 0 or ("TORCHELASTIC_RUN_ID" not in env and "SLURM_PROCID" not in env):
        return []
    scratch = tempfile.mkdtemp(prefix=f"drivebench-rank{rank}-")
    atexit.register(shutil.rmtree, scratch, ignore_errors=True)
    return [f'hydra.run.dir="{scratch}"', f'hydra.sweep.dir="{scratch}"', "hydra.output_subdir=null",
            "hydra/job_logging=none", "hydra/hydra_logging=none"]


# ---- a rank that dies -----------------------------------------------------------------------------
class RankWatch(threading.Thread):
    """Watches the rank processes Lightning launched; when one dies, stops the run and says which.

    The launcher (rank 0) may be blocked in a collective with the dead rank (NCCL waits until
    ``dist.timeout_minutes``), so after naming the rank and killing the other ranks it gives the
    main thread ``grace_s`` to fail on its own, then ends the process with exit code 1.
    """

    def __init__(self, procs: list[subprocess.Popen], poll_s: float = 1.0, grace_s: float = 10.0) -> None:
        super().__init__(daemon=True, name="drivebench-rank-watch")
        self.procs = procs
        self.poll_s = poll_s
        self.grace_s = grace_s
        self.failed: str | None = None

    def run(self) -> None:
        while True:
            time.sleep(self.poll_s)
            if all(proc.poll() == 0 for proc in self.procs):
                return
            message = dead_rank_message(self.procs)
            if message is None:  # still running, or stopped by this process (DistJob's teardown)
                if all(proc.poll() is not None for proc in self.procs):
                    return
                continue
            self.failed = message
            try:
                stderr_line(f"{message}; stopping the other ranks")
                kill_ranks(self.procs)
                time.sleep(self.grace_s)  # the main thread usually fails first, naming the rank itself
                stderr_line(None)
            finally:
                os._exit(1)


def _watch_rank_processes(child_processes: list[subprocess.Popen]) -> None:
    RankWatch(child_processes).start()


def _global_rank(local_rank: int, procs_on_node: int) -> int:
    return int(os.environ.get("NODE_RANK", "0") or 0) * procs_on_node + local_rank


_KILLED: set[int] = set()  # rank processes this process killed: they did not fail on their own


def dead_rank_message(procs: list[subprocess.Popen], wait_s: float = 0.0) -> str | None:
    """One line naming the first rank process (local rank i + 1) that failed on its own, or None.

    ``wait_s``: how long to wait for one to exit (a peer that broke a collective may still be dying).
    """
    deadline = time.monotonic() + wait_s
    while True:
        for local_rank, proc in enumerate(procs, start=1):
            code = proc.poll()
            if code in (None, 0) or proc.pid in _KILLED or _stopped_on_signal(code):
                continue
            how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
            rank = _global_rank(local_rank, len(procs) + 1)
            return (f"drivebench: error: rank {rank} (pid {proc.pid}) {how} during the run (its own error, if it "
                    f"printed one, is above)")
        if time.monotonic() >= deadline or all(proc.poll() is not None for proc in procs):
            return None
        time.sleep(0.1)


def _stopped_on_signal(code: int) -> bool:
    """A rank's exit status that is this run's stop on a signal (128 + signal, or killed by it), not a failure."""
    from drivebench.signals import STOP, exit_code

    signum = STOP.stopping()
    return signum is not None and code in (exit_code(signum), -signum)


def kill_ranks(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            _KILLED.add(proc.pid)
            proc.kill()


class ExitRankAtStep:
    """Fault injection: rank ``rank`` leaves (or hangs) after training step ``step`` (see FAULT_*)."""

    def __init__(self, rank: int, step: int, hang: bool = False) -> None:
        self.rank = rank
        self.step = step
        self.hang = hang

    def callback(self) -> Any:
        from lightning.pytorch import Callback

        fault = self

        class _ExitRankAtStep(Callback):
            def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
                if trainer.global_rank == fault.rank and trainer.global_step >= fault.step:
                    what = "stops responding" if fault.hang else "exits abruptly"
                    print(f"drivebench: fault injection: rank {fault.rank} {what} after step {trainer.global_step}",
                          file=sys.stderr, flush=True)
                    while fault.hang:
                        time.sleep(60)
                    os._exit(FAULT_EXIT_CODE)

        return _ExitRankAtStep()

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> "ExitRankAtStep | None":
        env = os.environ if environ is None else environ
        rank = env.get(FAULT_EXIT_RANK_ENV)
        if not rank:
            return None
        return cls(int(rank), int(env.get(FAULT_EXIT_STEP_ENV) or 2), env.get(FAULT_HANG_ENV, "") not in ("", "0"))


class RankFailed(RuntimeError):
    """A rank process of this run died; the message names it."""


def lightning_launched_rank(environ: dict[str, str] | None = None) -> bool:
    """Is this process a rank that Lightning's launcher started (its parent is the node's rank-0 process)?"""
    env = os.environ if environ is None else environ
    local = env.get("LOCAL_RANK", "")
    return local.isdigit() and int(local) > 0 and "WORLD_SIZE" in env and not launched_externally(env)


def launcher_gone_message(launcher_pid: int, local_rank: int) -> str:
    node_zero = _global_rank(0, 1) if os.environ.get("NODE_RANK") in (None, "", "0") else None
    name = f"rank {node_zero}" if node_zero is not None else "this node's first rank"
    me = torch.distributed.get_rank() if torch.distributed.is_available() and torch.distributed.is_initialized() \
        else local_rank
    return (f"{name} (pid {launcher_pid}, the process that launched this one) ended during the run without a "
            f"word: killed (SIGKILL, the OOM killer) or crashed; rank {me} stopped because its peer is gone")


class LauncherWatch(threading.Thread):
    """In a rank Lightning launched: if the launching process (the node's rank 0) disappears, say so by name.

    Why: with rank 0 killed, the other ranks fail in their next collective with gloo's "Connection reset by
    peer" (or, on NCCL, wait until dist.timeout_minutes). The main thread's error is replaced by the name
    (:class:`DistJob`); if it is stuck instead, this thread ends the process after ``grace_s``.
    """

    def __init__(self, launcher_pid: int, local_rank: int, poll_s: float = 1.0, grace_s: float = 10.0) -> None:
        super().__init__(daemon=True, name="drivebench-launcher-watch")
        self.launcher_pid = launcher_pid
        self.local_rank = local_rank
        self.poll_s = poll_s
        self.grace_s = grace_s

    def gone(self) -> bool:
        return os.getppid() != self.launcher_pid

    def run(self) -> None:
        while not self.gone():
            time.sleep(self.poll_s)
        try:
            time.sleep(self.grace_s)  # the main thread usually fails first and names rank 0 itself
            stderr_line(f"drivebench: error: {launcher_gone_message(self.launcher_pid, self.local_rank)}")
        finally:
            os._exit(1)  # whatever the message met: a rank left behind waits forever (on a loader, a collective)


class DistJob:
    """Context for one Hydra job: restores the environment and tears DDP down when the job ends."""

    def __init__(self, child_timeout_s: float = 120.0, failed_child_timeout_s: float = 10.0) -> None:
        self._saved = {k: os.environ.get(k) for k in _DIST_ENV}
        self.trainers: list[Any] = []
        self.child_timeout_s = child_timeout_s
        self.failed_child_timeout_s = failed_child_timeout_s
        self.fault = ExitRankAtStep.from_env()
        self.launcher: LauncherWatch | None = None
        if lightning_launched_rank():
            self.launcher = LauncherWatch(os.getppid(), int(os.environ["LOCAL_RANK"]))
            self.launcher.start()

    def __enter__(self) -> "DistJob":
        return self

    def track(self, trainer: Any) -> None:
        """Remember a trainer whose rank processes this job must wait for (and inject a fault)."""
        self.trainers.append(trainer)
        if self.fault is not None:
            trainer.callbacks.append(self.fault.callback())

    def rank_processes(self) -> list[subprocess.Popen]:
        procs: list[subprocess.Popen] = []
        for trainer in self.trainers:
            launcher = getattr(trainer.strategy, "launcher", None)
            procs += [p for p in getattr(launcher, "procs", []) or [] if p not in procs]
        return procs

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        from drivebench.signals import Interrupted

        procs = self.rank_processes()
        # a stop on a signal is not a failure: every rank stops at the same step (or on its own copy
        # of the signal) and exits with 128 + its number; waiting for them is all there is to do
        interrupted = exc_type is not None and issubclass(exc_type, Interrupted)
        failed = exc_type is not None and exc_type is not SystemExit and not interrupted
        dead = dead_rank_message(procs, wait_s=3.0) if failed else None
        if failed:
            running = [(i, p.pid) for i, p in enumerate(procs, start=1) if p.poll() is None]
            if dead is None and running:  # e.g. a collective timed out: a rank stopped responding
                names = ", ".join(f"rank {_global_rank(i, len(procs) + 1)} (pid {pid})" for i, pid in running)
                print(f"drivebench: error: this rank failed while {names} still ran; stopping them. A timeout here "
                      f"means a rank did not reach the collective within dist.timeout_minutes", file=sys.stderr,
                      flush=True)
            kill_ranks(procs)  # they may be waiting for this process in a collective
        # every rank leaves the process group first (NCCL teardown waits for its peers), then
        # rank 0 waits for the rank processes it launched
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            if failed or not launched_externally():
                torch.distributed.destroy_process_group()
            else:  # the same processes run the sweep's next job in the same group (see launched_externally)
                _destroy_group_at_exit()
        timeout_s = self.failed_child_timeout_s if failed or interrupted else self.child_timeout_s
        for proc in procs:
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                log.error("rank process %s did not exit within %ss; killing it", proc.pid, timeout_s)
                kill_ranks([proc])
        for key, value in self._saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if failed and self.launcher is not None:
            deadline = time.monotonic() + 3.0  # the launcher's death may be a moment ahead of its reaping
            while not self.launcher.gone() and time.monotonic() < deadline:
                time.sleep(0.1)
            if self.launcher.gone():
                raise RankFailed(launcher_gone_message(self.launcher.launcher_pid, self.launcher.local_rank)) from exc
        if dead is None and not failed:
            dead = dead_rank_message(procs)  # rank 0 finished, but a rank failed (e.g. in its teardown)
        if dead is not None:
            # the last line the user reads names the dead rank, not the collective that noticed it
            raise RankFailed(dead.removeprefix("drivebench: error: ")) from exc


def launched_externally(environ: dict[str, str] | None = None) -> bool:
    """Were the rank processes started by torchrun or srun (not by Lightning from this process)?

    Then, under ``-m``, the same processes run every job of the sweep, so a job keeps the process
    group for the next one: a new group after ``destroy_process_group`` would reuse the launcher's
    store with the same keys (group names restart at 0) and hang in its rendezvous.
    """
    env = os.environ if environ is None else environ
    return "TORCHELASTIC_RUN_ID" in env or ("SLURM_PROCID" in env and int(env.get("SLURM_NTASKS", "1") or 1) > 1)


_GROUP_EXIT_HOOK: list[bool] = []


def _destroy_group_at_exit() -> None:
    if not _GROUP_EXIT_HOOK:
        _GROUP_EXIT_HOOK.append(True)
        atexit.register(lambda: torch.distributed.is_initialized() and torch.distributed.destroy_process_group())


def gather_objects(obj: Any) -> list[Any]:
    """Every rank's ``obj`` on every rank (a list of one outside DDP)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return [obj]
    out: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(out, obj)
    return out
