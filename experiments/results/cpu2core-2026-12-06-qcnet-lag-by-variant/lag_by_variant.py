"""QCNet's val minFDE per epoch, every convergence run on record, grouped by what `max` kept or took back.

    python lag_by_variant.py EXTRACTED_DIR

EXTRACTED_DIR holds each results folder's runs.tgz extracted into a folder of its own (any depth); a run folder's
name says its variant (`_none_`, `_max_`, `_max32_` precision 32-true, `_max_notf32_` TF32 off, `_maxdyn_`
compile_dynamic, `_max_gru32_` the trajectory GRU in float32, `_max_h32pgo_` the GRU and the output heads in float32, `_max_p53_` the same as defaults, `_max_fp32_` precision 32-true with TF32 off). Read with the report's own loader (completed and stopped runs); prints per epoch: mean (number
of runs, min-max) of val/minFDE.
"""
from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import Iterator

import pandas as pd

from drivebench.report import load_runs
from drivebench.report.loading import RunSet
from drivebench.report.convergence import validation_curve

VARIANTS = (("_none_", "none"), ("_max_notf32_", "max, TF32 off"), ("_max32_", "max, fp32 (TF32 on)"),
            ("_maxdyn_", "max, compile_dynamic"), ("_max_gru32_", "max, GRU in fp32"),
            ("_max_h32pgo_", "max, GRU and output heads in fp32"),
            ("_max_p53_", "max, GRU and output heads in fp32 (b53, the defaults)"),
            ("_max_fp32_", "max, fp32 with TF32 off (b54)"), ("_max_", "max"))


def variant(name: str) -> str | None:
    """The variant a run folder's name says; None for a name of none (another schedule: bench55's 15-epoch runs)."""
    return next((label for key, label in VARIANTS if key in f"_{name}_"), None)


def qcnet_run_dirs(found: RunSet) -> list[str]:
    """Every QCNet convergence run the report's loader read (completed, or stopped by a signal)."""
    every = sorted({*found.runs.get("run_dir", []), *found.stopped.get("run_dir", [])})
    return [run_dir for run_dir in every if Path(run_dir).name.startswith("qcnet_conv_")]


def qcnet_runs(root: Path) -> Iterator[tuple[str, pd.DataFrame, pd.DataFrame]]:
    """(run folder name, its validation curve of val/minFDE, its train/loss series) of every QCNet convergence run
    under ``root``."""
    found = load_runs([root])
    for run_dir in qcnet_run_dirs(found):
        yield (Path(run_dir).name, validation_curve(found.scalars, run_dir, "val/minFDE"),
               validation_curve(found.scalars, run_dir, "train/loss"))  # any logged series, in step order


def main(root: Path) -> None:
    groups: dict[str, list[list[float]]] = {}
    for name, val, _ in qcnet_runs(root):
        curve = list(val["value"])
        if curve and variant(name) is not None:
            groups.setdefault(variant(name), []).append(curve)
    for label, curves in groups.items():
        cells = []
        for epoch in range(max(map(len, curves))):
            xs = [c[epoch] for c in curves if len(c) > epoch]
            cells.append(f"e{epoch + 1} {statistics.mean(xs):.2f} (n={len(xs)}, {min(xs):.2f}-{max(xs):.2f})")
        print(f"{label:22s} " + " | ".join(cells))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
