"""Find run directories under any set of folders: single runs, multiruns, copies from other machines.

A run directory is one Hydra job directory: it holds ``.hydra/config.yaml`` (written as the job
starts) and, once the run finished, ``summary.json``. Where a directory sits says nothing about the
run: machine, model and setting are read from the files, so runs copied side by side from
different machines (``results/h200/...``, ``results/a100/...``) are found the same way.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

SUMMARY = "summary.json"
HYDRA_CONFIG = Path(".hydra") / "config.yaml"
EVENTS_PREFIX = "events.out.tfevents."


class NoRunsFound(Exception):
    """None of the given folders holds a run (neither ``summary.json`` nor ``.hydra/config.yaml``)."""


@dataclass
class RunDir:
    """The files of one run that the report reads (any of them may be missing)."""

    path: Path
    summary: Path | None
    hydra_dir: Path | None
    event_files: list[Path] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)


def is_run_dir(path: Path) -> bool:
    return (path / SUMMARY).is_file() or (path / HYDRA_CONFIG).is_file()


def _collect(path: Path) -> RunDir:
    summary = path / SUMMARY
    hydra_dir = path / ".hydra"
    events = sorted(p for p in path.rglob(f"{EVENTS_PREFIX}*") if p.is_file())
    return RunDir(
        path=path,
        summary=summary if summary.is_file() else None,
        hydra_dir=hydra_dir if hydra_dir.is_dir() else None,
        event_files=events,
        logs=sorted(path.glob("*.log")),
    )


def find_run_dirs(roots: list[Path]) -> list[RunDir]:
    """Every run directory at or below ``roots`` (sorted, each once; symlinked folders followed once).

    Raises FileNotFoundError naming a root that does not exist, NoRunsFound when there is no run.
    """
    found: dict[Path, RunDir] = {}
    for root in roots:
        if not root.exists():
            raise FileNotFoundError(f"{root} does not exist")
        if not root.is_dir():
            raise NotADirectoryError(f"{root} is not a directory (give the folder that holds the runs)")
        for dirpath, dirnames, _ in os.walk(root, followlinks=True):
            path = Path(dirpath)
            if is_run_dir(path):
                real = path.resolve()
                if real not in found:
                    found[real] = _collect(path)
                dirnames[:] = []  # a run's own subfolders (tb/, checkpoints/) hold no other runs
            else:
                dirnames[:] = [d for d in dirnames if not d.startswith(".")]
    if not found:
        shown = ", ".join(str(r) for r in roots)
        raise NoRunsFound(f"no drivebench runs under {shown}: a run folder holds summary.json or "
                          ".hydra/config.yaml (give a run's output dir, a multirun sweep dir, or a folder of them)")
    return sorted(found.values(), key=lambda r: str(r.path))


def runs_from_env(default: Path, environ: "os._Environ[str] | dict[str, str] | None" = None) -> list[Path]:
    """The folders the notebooks read: ``DRIVEBENCH_RUNS`` (one, or several separated by ``os.pathsep``),
    else ``default``.

    A relative folder resolves against the directory the user started Jupyter from (its ``$PWD``),
    not the kernel's working directory: Jupyter runs a notebook's kernel in the notebook's folder, so
    ``DRIVEBENCH_RUNS=outputs/multirun/... jupyter lab notebooks/`` would otherwise look in
    ``notebooks/outputs/``."""
    environ = os.environ if environ is None else environ
    raw = environ.get("DRIVEBENCH_RUNS", "")
    if not raw.strip():
        return [default]
    started_in = Path(environ.get("PWD") or os.getcwd())
    if not started_in.is_dir():
        started_in = Path.cwd()
    folders = [Path(p).expanduser() for p in raw.split(os.pathsep) if p.strip()]
    return [p if p.is_absolute() else started_in / p for p in folders]
