"""The thread budget (``accel.threads``): how many compute threads the training process and each
loader / pool worker may run, so that together they fit the cores this process may use.

Why: PyTorch sizes its intra-op pool (OpenMP, MKL) and numpy's BLAS to the machine's cores in every
process, whatever else runs. Training threads plus loader workers plus another busy process on the
same cores then take turns on them, and OpenMP threads that wait at a barrier for a descheduled
partner stall each op: the same bounded QCNet run took 37.3 s per step with PyTorch's defaults and
1.33 s with one thread on this project's busy 2-core machine (issue 24).

``auto``: each loader worker and preprocessing-pool process 1 thread (torch's own DataLoader
choice for workers), the training process the cores its workers leave (at least 1), inter-op
pools 1 (drivebench launches no inter-op tasks). ``<n>``: the training process ``n`` threads, the
workers as for auto. ``default``: nothing is set, PyTorch's and the BLAS libraries' own defaults
(``accel=none``: upstream's behaviour); the summary still records what they came to.

Applied in the training process by :meth:`ThreadBudget.apply` (``app.build_run``), in DataLoader
workers by the datamodule's ``worker_init_fn`` and in process pools by their ``initializer``
(:func:`pool_kwargs`), both calling :func:`limit_threads` as each worker starts. BLAS and OpenMP
pools are set through threadpoolctl.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from drivebench.errors import ConfigError

THREAD_MODES = ("auto", "default")
WORKER_THREADS = 1  # per loader worker and pool process under a budget (torch's DataLoader sets the same)
INTEROP_THREADS = 1

# the per-worker thread count that process pools started from this process use (None: defaults);
# set by ThreadBudget.apply, read by pool_kwargs in this process, inherited by forked children
_pool_threads: int | None = None
_limits: Any = None        # the threadpoolctl limiter of this process (kept alive on purpose)
_original: dict[str, int] = {}  # this process's torch thread counts before the first budget


def check_knob(value: Any) -> int | str:
    """``accel.threads``: auto | default | a whole number >= 1 (ConfigError otherwise)."""
    if value in THREAD_MODES:
        return str(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"accel.threads={value!r} is not valid; use auto, default or a whole number >= 1 "
                          "(intra-op threads of the training process)")
    return value


def training_threads(knob: int | str, cores: int, loader_workers: int) -> int | None:
    """Intra-op threads of the training process (None: PyTorch's default)."""
    if knob == "default":
        return None
    if knob == "auto":
        return max(cores - loader_workers, 1)
    return int(knob)


def in_effect() -> dict[str, int | None]:
    """The thread counts in force in this process now: torch's pools, and BLAS / OpenMP per threadpoolctl."""
    import torch

    counts: dict[str, int | None] = {"torch_intra_op": torch.get_num_threads(),
                                     "torch_inter_op": torch.get_num_interop_threads(), "blas": None, "openmp": None}
    try:
        from threadpoolctl import threadpool_info

        for lib in threadpool_info():
            api = lib.get("user_api")
            if api in ("blas", "openmp"):
                counts[api] = max(counts[api] or 0, int(lib.get("num_threads") or 0))
    except Exception:  # threadpoolctl missing or a library it cannot query: report torch only
        pass
    return counts


def limit_threads(threads: int | None) -> dict[str, int | None]:
    """Set torch's intra-op / inter-op and the BLAS / OpenMP pools of this process to ``threads``
    (None: leave them); returns what is in effect. For worker processes, as they start."""
    global _limits
    if threads is not None:
        import torch

        _restore_limits()  # one limiter per process: its "original" stays the counts before any budget
        try:
            from threadpoolctl import threadpool_limits

            _limits = threadpool_limits(threads)  # BLAS (numpy's OpenBLAS, MKL) and OpenMP
        except ImportError:  # pragma: no cover - threadpoolctl is a dependency
            pass
        torch.set_num_threads(threads)
        try:
            torch.set_num_interop_threads(min(threads, INTEROP_THREADS))
        except RuntimeError:  # set once per process, and a forked worker inherits its parent's pool size
            pass
    return in_effect()


def _init_pool(threads: int | None, initializer: Callable[..., None] | None, initargs: tuple) -> None:
    limit_threads(threads)
    if initializer is not None:
        initializer(*initargs)


def pool_kwargs(initializer: Callable[..., None] | None = None, initargs: tuple = ()) -> dict[str, Any]:
    """``ProcessPoolExecutor`` keyword arguments that start every pool process within the budget
    applied in this process (then run ``initializer``); without a budget only ``initializer``."""
    if _pool_threads is None:
        return {"initializer": initializer, "initargs": initargs} if initializer is not None else {}
    return {"initializer": _init_pool, "initargs": (_pool_threads, initializer, initargs)}


@dataclass
class ThreadBudget:
    """Threads per process for one training process and its workers (``settings.threads``)."""

    knob: int | str                 # accel.threads as configured: auto | default | n
    cores: int                      # cores this training process may use (its share when several run)
    cores_source: str               # where the machine's core count came from (affinity, cgroup quota)
    processes: int                  # training processes on this machine sharing those cores (DDP ranks)
    training_threads: int | None    # intra-op threads of the training process (None: PyTorch's default)
    interop_threads: int | None
    loader_workers: int
    worker_threads: int | None      # per loader worker (None: defaults; torch's DataLoader sets 1 itself)
    pool_workers: int               # one-time preprocessing pool (runs before training, not beside it)
    pool_threads: int | None
    applied: dict[str, Any] = field(default_factory=dict)  # what apply() found in effect afterwards

    @classmethod
    def plan(cls, knob: int | str, machine_cores: int, cores_source: str, processes: int, loader_workers: int,
             pool_workers: int) -> "ThreadBudget":
        knob = check_knob(knob)
        processes = max(int(processes), 1)
        cores = max(machine_cores // processes, 1)
        on = knob != "default"
        return cls(knob=knob, cores=cores, cores_source=cores_source, processes=processes,
                   training_threads=training_threads(knob, cores, loader_workers),
                   interop_threads=INTEROP_THREADS if on else None, loader_workers=loader_workers,
                   worker_threads=WORKER_THREADS if on else None, pool_workers=pool_workers,
                   pool_threads=WORKER_THREADS if on else None)

    @property
    def active(self) -> bool:
        return self.training_threads is not None

    def threads_beside_training(self) -> int | None:
        """Training threads plus every loader worker's threads (None: not known before apply with defaults)."""
        training = self.training_threads if self.active else self.applied.get("torch_intra_op")
        if training is None:
            return None
        return training + self.loader_workers * (self.worker_threads or 1)

    def note(self) -> str:
        """One line: what runs on how many cores, and whether it fits."""
        total = self.threads_beside_training()
        training = self.training_threads if self.active else self.applied.get("torch_intra_op")
        what = "PyTorch's default" if not self.active else f"accel.threads={self.knob}"
        share = f" (of {self.processes} processes' cores)" if self.processes > 1 else ""
        head = (f"{_count(training, 'training thread')} ({what}) + {_count(self.loader_workers, 'loader worker')} "
                f"x {self.worker_threads or 1} on {_count(self.cores, 'usable core')}{share}")
        if total is None or total <= self.cores:
            return head + ": fits"
        if self.active and self.loader_workers >= self.cores:
            return (head + f": the loader workers alone take every core, {total - self.cores} thread(s) over; "
                    f"accel.num_workers={max(self.cores - 1, 0)} fits")
        fix = "accel.threads=auto" if not self.active or self.knob != "auto" else "fewer accel.num_workers"
        return head + f": {total - self.cores} thread(s) more than cores; {fix} fits"

    def apply(self) -> "ThreadBudget":
        """Set this process's threads and the count its process pools start with; record what is in effect.

        ``default`` sets nothing: the counts stay what PyTorch and the BLAS libraries chose (or what
        this process set before), and process pools start without a limit."""
        import torch

        global _pool_threads
        if not _original:  # this process's counts before any budget: PyTorch's defaults in a fresh run
            _original.update(torch_intra_op=torch.get_num_threads())
        if self.active:
            self.applied = {**limit_threads(self.training_threads)}
            _pool_threads = self.pool_threads
        else:
            _pool_threads = None
            self.applied = in_effect()
        return self

    def numerics_changes(self) -> list[str]:
        """``settings.numerics_changed_by``: a training thread count other than PyTorch's default here
        changes how parallel reductions split their sums (the same values, rounded in another order)."""
        default = _original.get("torch_intra_op")
        ran = self.applied.get("torch_intra_op")
        if not self.active or default is None or ran is None or ran == default:
            return []
        return [f"threads ({ran} intra-op threads instead of PyTorch's {default} here: parallel reductions "
                "sum in another order)"]

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["threads_beside_training"] = self.threads_beside_training()
        total = out["threads_beside_training"]
        out["fits"] = None if total is None else total <= self.cores
        out["note"] = self.note()
        return out


def restore_original() -> None:
    """Give this process the thread counts it had before its first budget, and pools no limit (for
    code that runs several runs in one process, such as tests)."""
    global _pool_threads
    _restore_limits()
    if _original:
        import torch

        torch.set_num_threads(_original["torch_intra_op"])
    _pool_threads = None


def _count(n: int | None, what: str) -> str:
    return f"n {what}s" if n is None else f"{n} {what}" + ("" if n == 1 else "s")


def _restore_limits() -> None:
    global _limits
    if _limits is not None:
        try:
            _limits.restore_original_limits()
        except Exception:  # pragma: no cover - a library unloaded meanwhile
            pass
        _limits = None
