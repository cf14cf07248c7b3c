"""The OpenMMLab stack for the ``openmmlab`` tests: installed by the test session itself, never skipped.

Why here: CI runs ``make test`` on a fresh clone, where mmcv must be compiled (about 7 min on 2 idle
cores; the wheel is then cached outside the clone). When tests marked ``openmmlab`` are collected
and the stack does not import, the installer starts in the background at collection (niced, so it
takes only the CPU the rest of the suite leaves idle), the ``openmmlab`` tests are moved to the end,
and the fixture :func:`openmmlab_stack` waits for it. If the install fails, every ``openmmlab`` test
fails with the installer's last lines; nothing is skipped.

Under pytest-xdist every worker collects, but only the first (``gw0``) starts the background install; a
worker that gets ``openmmlab`` tests without having started it runs the installer in the foreground, which
waits on the installer's own lock (``install.py``) and then finds the stack installed.
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
    """Run the openmmlab tests last; start the install in the background if they need it."""
    wanted = [item for item in items if item.get_closest_marker(MARKER)]
    if not wanted:
        return
    items[:] = [item for item in items if not item.get_closest_marker(MARKER)] + wanted
    if os.environ.get("PYTEST_XDIST_WORKER", "gw0") != "gw0":
        return  # gw0 starts the install; this worker's fixture waits for it (see the module docstring)
    from drivebench.openmmlab.install import verify

    ok, detail = verify()
    if ok:
        _STATE["ready"] = detail
        return
    log = _log_path()
    fh = open(log, "w")
    cmd = [sys.executable, "-m", "drivebench.openmmlab.install"]
    if len(wanted) < len(items) and hasattr(os, "nice"):
        cmd = ["nice", "-n", "19", *cmd]  # the rest of the suite runs meanwhile: only its idle CPU
    _STATE["proc"] = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=Path(__file__).parents[1])
    _STATE["log"] = log
    _STATE["started"] = time.perf_counter()
    _say(config, f"the OpenMMLab stack is not usable here ({detail}); installing it in the background "
                 f"(first time: builds mmcv, about 7 min of 2 idle cores; log: {log}). Its {len(wanted)} tests run last.")


def _install_in_foreground_unless_ready() -> None:
    """This worker did not start the install: if the stack does not import yet, run the installer, which
    waits for gw0's (holding the installer's lock) and then finds the stack installed, or installs it."""
    from drivebench.openmmlab.install import verify

    ok, detail = verify()
    if ok:
        _STATE["ready"] = detail
        return
    log = _log_path().with_name(f"openmmlab-install-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}.log")
    _STATE["proc"] = subprocess.Popen([sys.executable, "-m", "drivebench.openmmlab.install"], stdout=open(log, "w"),
                                      stderr=subprocess.STDOUT, cwd=Path(__file__).parents[1])
    _STATE["log"] = log
    _STATE["started"] = time.perf_counter()


@pytest.fixture(scope="session")
def openmmlab_stack(pytestconfig: pytest.Config) -> str:
    """Wait for the background install (if one runs); fail with its reason if it failed."""
    if "proc" not in _STATE and "ready" not in _STATE:  # an xdist worker other than gw0
        _install_in_foreground_unless_ready()
    proc = _STATE.get("proc")
    if proc is not None:
        assert isinstance(proc, subprocess.Popen)
        if proc.poll() is None:
            _say(pytestconfig, f"waiting for the OpenMMLab install (log: {_STATE['log']})")
        rc = proc.wait()
        took = time.perf_counter() - float(_STATE["started"])  # type: ignore[arg-type]
        tail = "\n".join(Path(str(_STATE["log"])).read_text(errors="replace").splitlines()[-30:])
        if rc != 0:
            pytest.fail(f"the OpenMMLab install failed (exit {rc}) after {took:.0f} s; its log ends:\n{tail}",
                        pytrace=False)
        _say(pytestconfig, f"OpenMMLab install finished in {took:.0f} s")
        from drivebench.openmmlab.install import verify

        ok, detail = verify()
        if not ok:
            pytest.fail(f"the OpenMMLab install finished but the stack does not import: {detail}", pytrace=False)
        _STATE.pop("proc")
        _STATE["ready"] = detail
    return str(_STATE.get("ready", ""))
