"""Shared fixtures: one embedded-data cache per test session, helpers to run drivebench."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from openmmlab_setup import openmmlab_stack, pytest_collection_modifyitems  # noqa: F401 (fixture + hook)

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def one_torch_thread():
    """One intra-op thread for a module's in-process tests: two shared CPU cores and two OpenMP threads
    stall each other for seconds per op. Use with ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def drivebench_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A DRIVEBENCH_CACHE for this test session (embedded sets are generated once into it)."""
    return tmp_path_factory.mktemp("drivebench-cache")


def run_cli(args: list[str], cache: Path, cwd: Path | None = None, timeout: float = 600,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python -m drivebench <args>`` in a subprocess with the session's data cache."""
    # one compute thread per process: test processes share 2 cores with loader workers and each
    # other, and oversubscribed threads stall (seconds per op) far more than they help
    full_env = {**os.environ, "DRIVEBENCH_CACHE": str(cache), "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
                **(env or {})}
    return subprocess.run([sys.executable, "-m", "drivebench", *args], cwd=cwd or REPO, env=full_env,
                          capture_output=True, text=True, timeout=timeout)
