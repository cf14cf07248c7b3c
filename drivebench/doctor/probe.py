"""Small tools the checks share: guarded imports, installed versions, probes run in a child
process with a deadline, and directories made (and later removed) by the doctor.

Why a child process for probes: a torch.compile that never returns or an NCCL all-reduce over a
broken peer-to-peer path hangs inside C++ where no Python timeout reaches. Run in its own process
group, such a probe is killed at its deadline and reported as FAIL instead of hanging the doctor.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

RECORD_PREFIX = "DOCTOR-RECORD "  # probes print their results as this prefix + one JSON object per line


def import_module(name: str) -> ModuleType:
    """The one place the doctor imports optional or fragile packages (tests replace it)."""
    return importlib.import_module(name)


def import_or_error(name: str) -> tuple[ModuleType | None, Exception | None]:
    """``(module, None)`` or ``(None, the exception)``; never raises for a broken package."""
    try:
        return import_module(name), None
    except Exception as err:  # ImportError, OSError (missing .so), RuntimeError from a broken build...
        return None, err


def try_import(name: str) -> tuple[ModuleType | None, str | None]:
    """``(module, None)`` or ``(None, "ExceptionType: message")``."""
    module, err = import_or_error(name)
    return module, (error_text(err) if err is not None else None)


def is_absent(err: Exception | None, name: str) -> bool:
    """True when ``err`` says the package ``name`` itself is not installed (not that it is broken)."""
    top = name.split(".")[0]
    return isinstance(err, ModuleNotFoundError) and err.name in (name, top)


def error_text(err: BaseException, limit: int = 400) -> str:
    text = f"{type(err).__name__}: {err}".strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."


def installed_version(dist: str) -> str | None:
    """Version of an installed distribution (pip name), None if not installed."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def version_tuple(version: str | None) -> tuple[int, ...]:
    """``"2.14.1+cu130"`` -> ``(2, 14, 1)``; ``"26.0.0rc1"`` -> ``(26, 0, 0)``; stops at the first non-number."""
    out: list[int] = []
    for part in (version or "").split("+")[0].split("."):
        match = re.match(r"\d+", part)
        if match is None:
            break
        out.append(int(match.group()))
        if match.end() != len(part):
            break
    return tuple(out)


def gib(nbytes: float | None) -> str:
    if nbytes is None:
        return "unknown"
    if nbytes >= 2**30:
        return f"{nbytes / 2**30:.1f} GiB"
    if nbytes >= 2**20:
        return f"{nbytes / 2**20:.0f} MiB"
    return f"{nbytes / 2**10:.0f} KiB"


@dataclass
class ProbeRun:
    """What came back from a child probe: its JSON records and how it ended."""

    records: list[dict[str, Any]] = field(default_factory=list)
    returncode: int | None = None
    timed_out: bool = False
    elapsed_s: float = 0.0
    output_tail: str = ""

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def failure(self) -> str:
        """One paragraph saying why the probe did not finish cleanly."""
        if self.timed_out:
            return f"no answer after {self.elapsed_s:.0f} s (killed)"
        tail = self.output_tail.strip().splitlines()
        last = next((line for line in reversed(tail) if line.strip()), "")
        return f"exit code {self.returncode}: {last}" if last else f"exit code {self.returncode}"


def probe_env(extra: dict[str, str] | None = None, drop: tuple[str, ...] = ()) -> dict[str, str]:
    """Environment for a child probe: ours, NVLink multicast off, ``drop`` removed, ``extra`` set."""
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["NCCL_NVLS_ENABLE"] = "0"  # NVLink SHARP/multicast must stay off on the GPU machines
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    # the probe imports drivebench: make it findable from any working directory, installed or not
    package_parent = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH")) if p)
    return env


def run_probe(module: str, args: list[str], timeout_s: float, env: dict[str, str] | None = None,
              idle_timeout_s: float | None = None) -> ProbeRun:
    """Run ``python -m module args`` in its own process group; collect its records until it exits.

    ``timeout_s`` bounds the whole run; ``idle_timeout_s`` bounds the wait for the next record
    after the first (a probe measuring many GPU pairs hangs on one pair, not on all of them).
    On either deadline the whole process group (the probe and any workers it spawned) is killed.
    """
    cmd = [sys.executable, "-m", module, *args]
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env if env is not None else probe_env(), start_new_session=True)
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    run = ProbeRun()
    tail: list[str] = []
    deadline = started + timeout_s
    while True:
        now = time.perf_counter()
        wait = deadline - now
        if idle_timeout_s is not None and run.records:
            wait = min(wait, idle_timeout_s)
        try:
            line = lines.get(timeout=max(wait, 0.0))
        except queue.Empty:
            run.timed_out = True
            _kill_group(proc)
            break
        if line is None:
            break
        if line.startswith(RECORD_PREFIX):
            try:
                run.records.append(json.loads(line[len(RECORD_PREFIX):]))
            except json.JSONDecodeError:
                tail.append(line)
        else:
            tail.append(line)
            del tail[:-40]
    run.returncode = proc.wait()
    reader.join(timeout=5)
    run.elapsed_s = time.perf_counter() - started
    run.output_tail = "".join(tail)[-4000:]
    return run


def _kill_group(proc: subprocess.Popen[str]) -> None:
    """Kill the probe we started and everything it spawned (its own session / process group)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()


def emit(record: dict[str, Any]) -> None:
    """Called inside a probe: hand one record back to the doctor."""
    print(RECORD_PREFIX + json.dumps(record, default=str), flush=True)


class MadeDirs:
    """Directories the doctor had to create to test a path; removed again at the end."""

    def __init__(self) -> None:
        self.tops: list[Path] = []

    def make(self, path: Path) -> None:
        """``mkdir -p path``, remembering the top-most directory that did not exist before."""
        path = Path(path).absolute()
        missing = [p for p in [path, *path.parents] if not p.exists()]
        path.mkdir(parents=True, exist_ok=True)
        if missing:
            self.tops.append(missing[-1])

    def cleanup(self) -> None:
        for top in reversed(self.tops):
            shutil.rmtree(top, ignore_errors=True)
        self.tops.clear()
