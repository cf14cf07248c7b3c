"""How loader workers start: fork, unless forking is known to be unsafe in this process right now.

Why fork by default: a forked worker starts at once with the dataset it inherits; a ``forkserver`` or
``spawn`` worker unpickles its dataset, and its server or the worker first imports the main module
(torch, Lightning: seconds). PyTorch's DataLoader makes the same choice on Linux.

When fork is unsafe: CPython before 3.10.15 / 3.11.10 (gh-112275) deadlocks a child forked while another
thread holds the interpreter's thread-list lock; the child hangs before running any code and the run waits
for its batch forever. In a gloo DDP rank gloo's threads take that lock, without the GIL, each time they
free a finished collective's tensors (found with gdb in this project's CI on 3.11.7). There the workers
start by ``forkserver``: its server is started by fork+exec from C, with no Python run in between, and
forks each worker from its own process, where no such thread runs. Checked when each loader is built, so a
run that starts its process group later is covered.

Pools (preprocessing, data generation, the shared-memory cache) keep ``fork``: their workers read module
state they inherit (loaded devkits, the generation plan), and they run while a run prepares its data, before its
first Trainer starts the process group (bench/runners.py), so no gloo thread runs beside them.
"""

from __future__ import annotations

import logging
import multiprocessing
import sys
from multiprocessing.context import BaseContext
from typing import Sequence

log = logging.getLogger(__name__)

# the first release of each line with the gh-112275 fix (September 2024); 3.12 and later were never affected
FORK_DEADLOCK_FIXED = {(3, 10): (3, 10, 15), (3, 11): (3, 11, 10)}
_said: set[str] = set()


def has_fork_deadlock(version_info: tuple[int, ...] | None = None) -> bool:
    """Whether this interpreter (or ``version_info``) is a release with CPython gh-112275."""
    info = tuple(version_info or sys.version_info[:3])
    fixed = FORK_DEADLOCK_FIXED.get(info[:2])
    return fixed is not None and info[:3] < fixed


def gloo_group_active() -> bool:
    """Whether this process has a default process group that runs gloo (imports nothing that is not loaded)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not (dist.is_available() and dist.is_initialized()):
        return False
    return "gloo" in str(dist.get_backend())


def fork_hazard(version_info: tuple[int, ...] | None = None) -> str | None:
    """Why forking a worker now could deadlock it, or None where forking is safe."""
    info = tuple(version_info or sys.version_info[:3])
    if not has_fork_deadlock(info) or not gloo_group_active():
        return None
    fixed = ".".join(map(str, FORK_DEADLOCK_FIXED[info[:2]]))
    return (f"Python {'.'.join(map(str, info[:3]))} can deadlock a worker forked beside gloo's threads "
            f"(CPython gh-112275, fixed in {fixed})")


def worker_start_method(version_info: tuple[int, ...] | None = None) -> str:
    """The start method for loader workers built now: forkserver where :func:`fork_hazard` says fork is
    unsafe, else fork (spawn where the platform has no fork)."""
    if "fork" not in multiprocessing.get_all_start_methods() or sys.platform == "darwin":
        return "spawn"
    why = fork_hazard(version_info)
    if why is None:
        return "fork"
    if why not in _said:
        _said.add(why)
        log.info("loader workers start by forkserver, not fork: %s", why)
    return "forkserver"


def worker_context(preload: Sequence[str] = ()) -> BaseContext:
    """The multiprocessing context for ``DataLoader(multiprocessing_context=...)`` (see the module's docstring).

    ``preload``: modules the forkserver imports once, before it forks any worker (those of the dataset and
    ``worker_init_fn``); without them every worker imports torch and drivebench itself (~1 s each on a 2-core
    machine: a run started as ``python -m`` gives the server no main path to preload). Only the first call of a
    process starts the server, so later lists are ignored."""
    ctx = multiprocessing.get_context(worker_start_method())
    if ctx.get_start_method() == "forkserver":
        ctx.set_forkserver_preload(["torch", *preload])
    return ctx
