"""Where QCNet's `max` trails `none`: each validation metric and loss term per epoch, mean ± standard error over
the runs on record (`none` against `max` with bf16, TF32, compile and graphs), and per seed for val minFDE.

    python val_parts.py EXTRACTED_DIR      (as lag_by_variant.py: each results folder's runs.tgz extracted)

The loss terms split the decoder: `reg_loss_propose` scores the first-stage trajectories, `reg_loss_refine` the
refined ones (which the minADE / minFDE / MR metrics read), `cls_loss` the mode probabilities.
"""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

import pandas as pd

from drivebench.report import load_runs
from lag_by_variant import qcnet_run_dirs, variant

TAGS = ("val/reg_loss_propose", "val/reg_loss_refine", "val/cls_loss", "val/minADE", "val/minFDE", "val/MR")


def per_epoch(root: Path) -> pd.DataFrame:
    """One row per (run, tag, epoch) of the QCNet convergence runs under ``root``: the values logged at epoch ends."""
    found = load_runs([root])
    scalars = found.scalars
    scalars = scalars[scalars["run_dir"].isin(qcnet_run_dirs(found)) & (scalars["phase"] == "train")
                      & scalars["tag"].isin(TAGS)].sort_values("step")
    scalars = scalars.assign(name=scalars["run_dir"].map(lambda r: Path(r).name))
    scalars = scalars.assign(variant=scalars["name"].map(variant), seed=scalars["name"].str.extract(r"_s(\d{4})")[0],
                             epoch=scalars.groupby(["run_dir", "tag"]).cumcount() + 1)
    return scalars


def cell(values: list[float]) -> str:
    return f"{statistics.mean(values):.3f} ± {statistics.stdev(values) / len(values) ** 0.5:.3f} (n={len(values)})"


def main(root: Path) -> None:
    rows = per_epoch(root)
    for tag in TAGS:
        print(tag)
        for epoch in range(1, 6):
            at = rows[(rows["tag"] == tag) & (rows["epoch"] == epoch)]
            none, fast = (at[at["variant"] == v]["value"].tolist() for v in ("none", "max"))
            if len(none) > 1 and len(fast) > 1:
                print(f"  epoch {epoch}: none {cell(none)}   max {cell(fast)}")
    print("val/minFDE by seed (none | max)")
    fde = rows[rows["tag"] == "val/minFDE"]
    for seed in sorted(fde["seed"].dropna().unique()):
        for epoch in (3, 4, 5):
            at = fde[(fde["seed"] == seed) & (fde["epoch"] == epoch)]
            none, fast = (at[at["variant"] == v]["value"].tolist() for v in ("none", "max"))
            if none and fast:
                print(f"  seed {seed} epoch {epoch}: none {statistics.mean(none):.2f} (n={len(none)}, "
                      f"{min(none):.2f}-{max(none):.2f})   max {statistics.mean(fast):.2f} (n={len(fast)}, "
                      f"{min(fast):.2f}-{max(fast):.2f})")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
