"""The OpenMMLab stack for the ``openmmlab`` tests: installed by the test session itself, never skipped.

Why here: CI runs ``make test`` on a fresh clone, where mmcv must be compiled (about 2.5 min on 2 idle
cores; the wheel is then cached outside the clone). When tests marked ``openmmlab`` are collected, the
installer starts in the background at collection (niced, so it takes only the CPU the rest of the suite
leaves idle); it first checks, under its lock, whether the stack imports, and then exits at once or
installs it. The ``openmmlab`` tests are moved to the end, and the fixture :func:`openmmlab_stack` waits
for the installer. If the install fails, every ``openmmlab`` test fails with the installer's last lines;
nothing is skipped.

Under pytest-xdist every worker collects, but only the first (``gw0``) starts the background installer; a
worker that reaches ``openmmlab`` tests without having started it runs the installer when it does, which
waits on the installer's lock (``install.py``) while gw0's works, and then finds the stack installed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

MARKER = "openmmlab"
_STATE: dict[str, object] = {}


def _log_path() -> Path:
    from drivebench.openmmlab.install import cache_root

    path = cache_root() / "wheels" / "openmmlab-install.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _say(config: pytest.Config, text: str) -> None:
    reporter = config.pluginmanager.getplugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"openmmlab: {text}")
    else:
        print(f"openmmlab: {text}", file=sys.stderr, flush=True)


@pytest.hookimpl(trylast=True)  # after `-m`/`-k` deselection: only tests that will run count
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run the openmmlab tests last; start the installer (check, install if missing) in the background."""
    wanted = [item for item in items if item.get_closest_marker(MARKER)]
    if not wanted:
        return
    items[:] = [item for item in items if not item.get_closest_marker(MARKER)] + wanted
    if os.environ.get("PYTEST_XDIST_WORKER", "gw0") != "gw0":
        return  # gw0 starts the installer; this worker's fixture waits for it (see the module docstring)
    log = _start_installer(_log_path(), niced=len(wanted) < len(items))  # niced: the rest runs meanwhile
    _say(config, f"checking the OpenMMLab stack in the background, installing it if it does not import (first "
                 f"time: builds mmcv, about 2.5 min of 2 idle cores; log: {log}). Its {len(wanted)} tests run last.")


def _start_installer(log: Path, niced: bool) -> Path:
    cmd = [sys.executable, "-m", "drivebench.openmmlab.install"]
    if niced and hasattr(os, "nice"):
        cmd = ["nice", "-n", "19", *cmd]  # only the CPU the tests leave idle
    with open(log, "w") as fh:
        _STATE["proc"] = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=Path(__file__).parents[1])
    _STATE["log"] = log
    _STATE["started"] = time.perf_counter()
    return log


@pytest.fixture(scope="session")
def openmmlab_stack(pytestconfig: pytest.Config) -> str:
    """Wait for the installer; fail with its reason if the stack could not be installed. Returns what it
    found (the installer's last line: the versions and the number of compiled op functions)."""
    if "proc" not in _STATE:  # an xdist worker other than gw0 (gw0's installer holds the lock meanwhile)
        worker = os.environ.get("PYTEST_XDIST_WORKER", "session")
        _start_installer(_log_path().with_name(f"openmmlab-install-{worker}.log"), niced=False)
    proc = _STATE["proc"]
    assert isinstance(proc, subprocess.Popen)
    if proc.poll() is None:
        _say(pytestconfig, f"waiting for the OpenMMLab installer (log: {_STATE['log']})")
    rc = proc.wait()
    took = time.perf_counter() - float(_STATE["started"])  # type: ignore[arg-type]
    lines = Path(str(_STATE["log"])).read_text(errors="replace").splitlines()
    if rc != 0:  # the installer also exits 1 when the stack, once installed, does not import
        tail = "\n".join(lines[-30:])
        pytest.fail(f"the OpenMMLab install failed (exit {rc}) after {took:.0f} s; its log ends:\n{tail}",
                    pytrace=False)
    _say(pytestconfig, f"OpenMMLab installer finished in {took:.0f} s")
    return lines[-1] if lines else ""
