"""QCNet's val minFDE per epoch, every convergence run on record, grouped by what `max` kept or took back.

    python lag_by_variant.py EXTRACTED_DIR

EXTRACTED_DIR holds each results folder's runs.tgz extracted into a folder of its own (any depth); a run folder's
name says its variant (`_none_`, `_max_`, `_max32_` precision 32-true, `_max_notf32_` TF32 off, `_maxdyn_`
compile_dynamic). Prints per epoch: mean (number of runs, min-max) of `fit/val/minFDE` from the run's TensorBoard file.
"""
from __future__ import annotations

import re
import statistics
import sys
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

VARIANTS = (("_none_", "none"), ("_max_notf32_", "max, TF32 off"), ("_max32_", "max, fp32 (TF32 on)"),
            ("_maxdyn_", "max, compile_dynamic"), ("_max_", "max"))


def variant(name: str) -> str:
    return next(label for key, label in VARIANTS if key in f"_{name}_")


def main(root: Path) -> None:
    groups: dict[str, list[list[float]]] = {}
    for tb in sorted(root.glob("**/qcnet_conv_*/tb")):
        acc = EventAccumulator(str(tb), size_guidance={"scalars": 0})
        acc.Reload()
        if "fit/val/minFDE" not in acc.Tags()["scalars"]:
            continue
        curve = [s.value for s in sorted(acc.Scalars("fit/val/minFDE"), key=lambda s: s.step)]
        groups.setdefault(variant(tb.parent.name), []).append(curve)
    for label, curves in groups.items():
        cells = []
        for epoch in range(max(map(len, curves))):
            xs = [c[epoch] for c in curves if len(c) > epoch]
            cells.append(f"e{epoch + 1} {statistics.mean(xs):.2f} (n={len(xs)}, {min(xs):.2f}-{max(xs):.2f})")
        print(f"{label:22s} " + " | ".join(cells))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
