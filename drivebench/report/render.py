"""Load, analyse and write a report: ``report.md``, ``report.csv``, PNG plots, and the terminal text."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from drivebench.report.analysis import Target, analyse, with_recorded_targets
from drivebench.report.convergence import (convergence_table, convergence_targets, followed_runs, too_easy,
                                           unfollowed_targets)
from drivebench.report.loading import Problem, RunSet, load_runs
from drivebench.report.plots import save_plots
from drivebench.report.scaling import write_scaling
from drivebench.report.tables import (convergence_display, main_table, problems_table, to_text, write_csv,
                                     write_markdown)


@dataclass
class ReportResult:
    runs: pd.DataFrame                    # the analysed table (what report.csv holds)
    problems: list[Problem]
    warnings: list[str]
    files: dict[str, Path] = field(default_factory=dict)
    terminal_text: str = ""
    convergence: dict[str, pd.DataFrame] = field(default_factory=dict)  # target label -> convergence table

    @property
    def completed(self) -> int:
        return len(self.runs)


def analysed(dirs: list[Path], targets: list[Target]) -> tuple[RunSet, pd.DataFrame]:
    """Read ``dirs`` and return the run set with its analysed table (speedup, order, and time to each
    of ``targets`` and of every target a run recorded)."""
    runset = load_runs(dirs)
    return runset, analyse(runset.runs, runset.scalars, with_recorded_targets(targets, runset.runs))


def terminal_text(runs: pd.DataFrame, targets: list[Target], problems: list[Problem], warnings: list[str],
                  files: dict[str, Path], convergence: dict[str, pd.DataFrame] | None = None) -> str:
    parts = []
    if not runs.empty:
        parts += [f"drivebench report: {len(runs)} completed run(s)", to_text(main_table(runs, targets))]
    for label, table in (convergence or {}).items():
        parts += [f"convergence: {label}", to_text(convergence_display(table))]
    if problems:
        parts += [f"{len(problems)} run(s) did not complete:", to_text(problems_table(problems))]
    parts += [f"warning: {w}" for w in warnings]
    if files:
        parts.append("written: " + ", ".join(str(p) for p in files.values()))
    return "\n".join(parts)


def write_report(dirs: list[Path], out: Path, targets: list[Target]) -> ReportResult:
    """The whole report for ``dirs`` into ``out`` (created if needed); ``targets`` and those the runs recorded."""
    runset = load_runs(dirs)
    targets = with_recorded_targets(with_recorded_targets(targets, runset.runs), runset.stopped)
    runs = analyse(runset.runs, runset.scalars, targets)
    # a convergence job stopped by its time cap still tells when it met a target
    followed = followed_runs(runs, runset.stopped, runset.scalars, targets)
    out.mkdir(parents=True, exist_ok=True)
    files: dict[str, Path] = {}
    skipped: dict[str, str] = {}
    plots = save_plots(runs, runset.scalars, targets, out, skipped, followed)
    runset.warnings.extend(f"{name}.png not written: {why}" for name, why in skipped.items())
    csv = out / "report.csv"
    write_csv(csv, runs)
    files["report.csv"] = csv
    convergence = {t.label: convergence_table(followed.runs, followed.scalars, t)
                   for t in convergence_targets(followed.runs, followed.scalars, targets)}
    runset.warnings.extend(
        f"{label}: every run that met it did so at its first validation, so its time to target is the time to "
        f"a first validation, not to a quality; give a harder target (report.target=..., or the model's "
        f"model.convergence.targets)" for label, table in convergence.items() if too_easy(table))
    runset.warnings.extend(unfollowed_targets(followed.runs, followed.scalars, targets))
    if convergence:
        frames = [table.assign(target=label) for label, table in convergence.items()]
        files["convergence.csv"] = out / "convergence.csv"
        write_csv(files["convergence.csv"], pd.concat(frames, ignore_index=True))
    scaling = write_scaling(runs, runset.problems, dirs, out)  # +experiment=scaling jobs: None without any
    md = out / "report.md"
    write_markdown(md, runs, targets, runset.problems, runset.warnings, plots, dirs, convergence)
    if scaling is not None:
        with md.open("a") as fh:
            fh.write("\n" + scaling.markdown())
        files.update(scaling.files)
    files["report.md"] = md
    files.update({f"{name}.png": path for name, path in plots.items()})
    text = terminal_text(runs, targets, runset.problems, runset.warnings, files, convergence)
    if scaling is not None and scaling.text():  # after the other tables, before the list of files written
        head, sep, written = text.rpartition("\nwritten: ")
        text = f"{head}\n{scaling.text()}{sep}{written}" if sep else f"{text}\n{scaling.text()}"
    return ReportResult(runs=runs, problems=runset.problems, warnings=runset.warnings, files=files,
                        terminal_text=text, convergence=convergence)
