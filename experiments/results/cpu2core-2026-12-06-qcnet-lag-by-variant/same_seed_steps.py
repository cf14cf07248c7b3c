"""Runs of one seed and setting, step by step: how far apart their training losses are at step 0 (the same weights
and the same batch: only the arithmetic can differ) and the first step where they are more than 1% apart.

    python same_seed_steps.py EXTRACTED_DIR

EXTRACTED_DIR as for lag_by_variant.py, whose reading of the runs (the report's own loader) it imports; only
`qcnet_conv_none_s*` and `qcnet_conv_max_s*` runs (the default settings) with at least 300 logged steps of
train/loss.
"""
from __future__ import annotations

import itertools
import re
import statistics
import sys
from pathlib import Path

from lag_by_variant import qcnet_runs  # the folder's other script: the same runs, read the same way


def main(root: Path) -> None:
    runs: dict[tuple[str, str], list[dict[int, float]]] = {}
    for name, _, series in qcnet_runs(root):
        match = re.match(r"qcnet_conv_(none|max)_s(20\d\d)", name)
        if not match:
            continue
        losses = dict(zip(series["step"].astype(int), series["value"]))
        if len(losses) >= 300:
            runs.setdefault(match.groups(), []).append(losses)
    for (setting, seed), group in sorted(runs.items()):
        step0 = [run[0] for run in group]
        pairs = list(itertools.combinations(group, 2))
        apart = [next((s for s in range(300) if abs(a[s] - b[s]) > 0.01 * abs(b[s])), None) for a, b in pairs]
        rel = [abs(a[0] - b[0]) / abs(b[0]) for a, b in pairs]
        print(f"{setting:4s} seed {seed}: {len(group)} runs, step-0 loss {min(step0):.3f}-{max(step0):.3f}"
              + (f", pairs at step 0 {min(rel):.0e}-{max(rel):.0e} apart, first >1% apart at step"
                 f" {min(apart)}-{max(apart)} (median {statistics.median(apart)})" if pairs else ""))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
