"""Shared fixtures: one embedded-data cache per test session, helpers to run drivebench.

`make test` runs the session on pytest-xdist workers (one per usable core): whatever is "once per
session" here lives in :func:`session_dir`, which every worker of the session sees, and is made under a
file lock by whichever worker needs it first (the embedded datasets' generators take one themselves)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from openmmlab_setup import openmmlab_stack, pytest_collection_modifyitems  # noqa: F401 (fixture + hook)

REPO = Path(__file__).resolve().parents[1]


def pytest_configure(config: pytest.Config) -> None:
    """An xdist worker computes on one intra-op thread: the workers are one per core, so a second
    OpenMP thread in each would only wait at every op's barrier for a core the other worker holds (the
    reason for :func:`one_torch_thread`, which the modules below had to ask for one by one). Subprocesses
    set their own threads (:func:`run_cli`: OMP_NUM_THREADS=1; a run's accel.threads)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)


@pytest.fixture(scope="module")
def one_torch_thread():
    """One intra-op thread for a module's in-process tests: two shared CPU cores and two OpenMP threads
    stall each other for seconds per op. Use with ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def in_process_cli(monkeypatch: pytest.MonkeyPatch):
    """Run the command's entry point in the test process and undo what a run sets process-wide: the
    environment (cache, thread variables), torch's thread counts, the logging handlers Hydra adds and
    Hydra's global state; the exit watchdog (which would end this process) is off."""
    import logging

    import torch
    from hydra.core.global_hydra import GlobalHydra

    env = dict(os.environ)
    threads = torch.get_num_threads(), torch.get_num_interop_threads()
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level

    def prepare(cache: Path, cwd: Path) -> None:
        monkeypatch.setenv("DRIVEBENCH_CACHE", str(cache))
        monkeypatch.setenv("DRIVEBENCH_EXIT_TIMEOUT_S", "0")
        monkeypatch.chdir(cwd)

    yield prepare
    GlobalHydra.instance().clear()
    root.handlers[:], root.level = handlers, level
    os.environ.clear()
    os.environ.update(env)
    torch.set_num_threads(threads[0])


def session_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder shared by every worker of this session: under xdist each worker's basetemp is
    ``<session>/popen-gwN``, so the session's is its parent; without xdist, the basetemp itself."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def session_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's one DRIVEBENCH_CACHE, shared by the workers (each dataset is generated once into it)."""
    path = session_dir(tmp_path_factory) / "drivebench-cache"
    path.mkdir(exist_ok=True)
    return path


@pytest.fixture(scope="session")
def drivebench_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A DRIVEBENCH_CACHE for this test session (embedded sets are generated once into it)."""
    return session_cache(tmp_path_factory)


def run_cli(args: list[str], cache: Path, cwd: Path | None = None, timeout: float = 600,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python -m drivebench <args>`` in a subprocess with the session's data cache."""
    # one compute thread per process: test processes share 2 cores with loader workers and each
    # other, and oversubscribed threads stall (seconds per op) far more than they help
    full_env = {**os.environ, "DRIVEBENCH_CACHE": str(cache), "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
                **(env or {})}
    return subprocess.run([sys.executable, "-m", "drivebench", *args], cwd=cwd or REPO, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


def assert_same(a: object, b: object, where: str = "") -> None:
    """Deep equality of nests of dicts, lists, tuples, tensors and arrays (dtype and shape included),
    naming the first place that differs."""
    import numpy as np
    import torch

    assert type(a) is type(b), where
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), where
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape, where
        np.testing.assert_array_equal(a, b, err_msg=where)
    else:
        assert a == b, where


@pytest.hookimpl(optionalhook=True)  # xdist's hooks: pytest runs without it too (the GPU machine's scripts)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto``: one worker per core this process may run on (its affinity), not per core of the host
    (xdist's default asks psutil for the host's physical cores, which a CPU-limited CI box may not have).
    ``PYTEST_XDIST_AUTO_NUM_WORKERS`` still wins (xdist reads it when this returns None)."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``--dist loadfile`` with the longest files first (tests/xdist_order.py)."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist_order import longest_file_first, read_durations

    return longest_file_first(config, log, read_durations())


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--write-durations", metavar="PATH", default=None,
                     help="write each test file's seconds as JSON to PATH (tests/durations.json orders make test)")


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    path = session.config.getoption("--write-durations")
    if path and not os.environ.get("PYTEST_XDIST_WORKER"):  # the controller sees every worker's reports
        from xdist_order import DurationWriter

        session.config.pluginmanager.register(DurationWriter(Path(path)), "drivebench-durations")
