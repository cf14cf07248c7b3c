"""The doctor's output: one coloured line per check (remedy underneath) and the ``--json`` file."""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any, TextIO

from drivebench.doctor.context import DoctorContext
from drivebench.doctor.result import CheckResult, Status

STYLES = {Status.PASS: "bold green", Status.WARN: "bold yellow", Status.FAIL: "bold red", Status.INFO: "cyan"}
NAME_WIDTH = 22


class Printer:
    """Writes to a terminal with rich when it is there, plain text otherwise."""

    def __init__(self, stream: TextIO | None = None) -> None:
        try:
            from rich.console import Console

            self._console: Any = Console(file=stream, highlight=False, soft_wrap=True)
        except ImportError:
            self._console = None
        self._stream = stream

    def line(self, text: str, style: str | None = None, prefix: tuple[str, str] | None = None) -> None:
        if self._console is None:
            print((prefix[0] if prefix else "") + text, file=self._stream, flush=True)
            return
        from rich.text import Text  # Text never parses markup, so "[...]" in a message prints as is

        out = Text()
        if prefix:
            out.append(prefix[0], style=prefix[1])
        out.append(text, style=style)
        self._console.print(out)

    def header(self, ctx: DoctorContext) -> None:
        m = ctx.machine
        gpus = (f"{len(m.gpus)}x {m.gpus[0].name}" if m.gpus else "no GPU")
        self.line(f"drivebench doctor: {m.hostname}, {m.cpu_model}, {m.cpu_cores} cores, {m.ram_gb:.0f} GiB RAM, "
                  f"/dev/shm {m.shm_gb or 0:.1f} GiB, {gpus}, torch {m.torch}, Python {m.python}", "bold")
        run = ctx.header()["run"]
        a = ctx.accel
        self.line(f"checking the run: model={run['model']} (size {run['model_size']}), data={run['data']}, "
                  f"accel={a.name} (num_workers={a.num_workers}, pin_memory={a.pin_memory}, compile={a.compile}, "
                  f"precision={a.precision}, shm_cache={a.shm_cache}), dist={run['dist']}, ckpt={run['ckpt']}")
        for note in ctx.notes:
            self.line(f"note: {note}", "dim")
        if ctx.skip_slow:
            self.line("--skip-slow: storage bandwidth, all-reduce and compile checks are skipped", "dim")
        self.line("")

    def result(self, result: CheckResult) -> None:
        self.line(f"{result.check:<{NAME_WIDTH}} {result.saw}",
                  prefix=(f"{result.status.value:<5} ", STYLES[result.status]))
        if result.remedy and result.status is not Status.PASS:
            self.line(f"{'':<{NAME_WIDTH + 6}}fix: {result.remedy}", "dim" if result.status is Status.INFO else None)

    def footer(self, results: list[CheckResult], json_path: Path | None) -> None:
        counts = Counter(r.status for r in results)
        summary = ", ".join(f"{counts.get(s, 0)} {s.value}" for s in Status)
        caveat = " (the WARN lines cost speed or robustness)" if counts.get(Status.WARN) else ""
        verdict = "not fit to train: fix the FAIL lines" if counts.get(Status.FAIL) else "fit to train" + caveat
        self.line("")
        self.line(f"{summary}: {verdict}", "bold red" if counts.get(Status.FAIL) else "bold green")
        if json_path is not None:
            self.line(f"records written to {json_path}", "dim")


def to_json(ctx: DoctorContext, results: list[CheckResult]) -> dict[str, Any]:
    """``{"header": {...machine fingerprint, run...}, "checks": [{"check", "status", "saw", "remedy", "data"}]}``"""
    counts = Counter(r.status.value for r in results)
    header = ctx.header()
    header["summary"] = {s.value: counts.get(s.value, 0) for s in Status}
    header["skip_slow"] = ctx.skip_slow
    return _finite({"header": header, "checks": [r.to_dict() for r in results]})


def _finite(value: Any) -> Any:
    """JSON has no inf/nan: non-finite numbers become null; paths and other objects become strings."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    if value is None or isinstance(value, (bool, int, str)):
        return value
    return str(value)


def write_json(path: Path, payload: dict[str, Any]) -> None:
    """Atomic write (temp file + rename) so a reader never sees half a report."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-", suffix=".tmp")
    with os.fdopen(fd, "w") as handle:
        json.dump(payload, handle, indent=2, default=str, allow_nan=False)
        handle.write("\n")
    os.replace(tmp, path)
