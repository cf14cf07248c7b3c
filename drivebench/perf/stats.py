"""Robust statistics of timing series (MLPerf-style: warm-up excluded, medians with spread)."""

from __future__ import annotations

import math
from typing import Iterable, Sequence


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile of already sorted values; q in [0, 100]."""
    if not sorted_values:
        return math.nan
    pos = (len(sorted_values) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    if lo == hi:
        return float(sorted_values[lo])
    return float(sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo))


def describe(values: Iterable[float]) -> dict[str, float]:
    """median, p10, p90, mean, min, max and n of the finite values."""
    vals = sorted(v for v in values if v is not None and math.isfinite(v))
    if not vals:
        return {"n": 0, "median": math.nan, "p10": math.nan, "p90": math.nan, "mean": math.nan,
                "min": math.nan, "max": math.nan}
    return {
        "n": len(vals),
        "median": percentile(vals, 50),
        "p10": percentile(vals, 10),
        "p90": percentile(vals, 90),
        "mean": sum(vals) / len(vals),
        "min": vals[0],
        "max": vals[-1],
    }
