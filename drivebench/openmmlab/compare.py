"""``python -m drivebench.openmmlab.compare SWEEP_DIR``: the runner comparison as ratios.

Reads the runs of one sweep (``scripts/bench_openmmlab.sh`` launches them: the same mmdet3d config
under ``bench=train`` and ``bench=mmengine``, ``accel=none`` and ``accel=max``, repeated) with the
report's loader, and writes ``compare.md`` / ``compare.json`` next to them: per accel setting the
median throughput of each runner (median over repeats of each run's per-step median), the ratio
drivebench / mmengine, and each runner's max / none.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

RUNNERS = ("mmengine", "drivebench")


def _median(values: list[float]) -> float:
    values = [v for v in values if isinstance(v, float) and math.isfinite(v)]
    return statistics.median(values) if values else math.nan


def compare(sweep: Path) -> dict[str, Any]:
    """Per (model size, accel): samples/s of each runner, ratios, step breakdown means."""
    from drivebench.report.loading import load_runs

    runs = load_runs([sweep]).runs
    if runs.empty:
        raise SystemExit(f"no completed runs under {sweep}")
    out: dict[str, Any] = {"sweep": str(sweep), "rows": []}
    for (size, accel), part in runs.groupby(["model_size", "accel"], sort=False):
        row: dict[str, Any] = {"model_size": size, "accel": accel}
        for runner in RUNNERS:
            mine = part[part["runner"] == runner]
            row[runner] = {
                "runs": len(mine),
                "samples_per_s": _median(list(mine["throughput_median"])),
                "samples_per_s_each": [round(float(v), 3) for v in mine["throughput_median"]],
                "step_s_mean": _median(list(mine["step_s_mean"])),
                "data_wait_fraction": _median(list(mine["data_wait_fraction"])),
                "compute_s_mean": _median(list(mine["compute_s_mean"])),
                "gpu_preprocess_s_mean": _median(list(mine["gpu_preprocess_s_mean"])),
                "loss_final": _median(list(mine["loss_final"])),
            }
        row["drivebench_over_mmengine"] = row["drivebench"]["samples_per_s"] / row["mmengine"]["samples_per_s"]
        out["rows"].append(row)
    for runner in RUNNERS:
        by = {r["accel"]: r[runner]["samples_per_s"] for r in out["rows"]}
        if "none" in by and "max" in by:
            out[f"{runner}_max_over_none"] = by["max"] / by["none"]
    return out


def render(result: dict[str, Any]) -> str:
    lines = ["| size | accel | mmengine samples/s | drivebench samples/s | drivebench / mmengine | "
             "data wait (mmengine / drivebench) | runs |", "|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        mm, db = r["mmengine"], r["drivebench"]
        lines.append(f"| {r['model_size']} | {r['accel']} | {mm['samples_per_s']:.3g} | {db['samples_per_s']:.3g} | "
                     f"**{r['drivebench_over_mmengine']:.2f}x** | {mm['data_wait_fraction']:.1%} / "
                     f"{db['data_wait_fraction']:.1%} | {mm['runs']} + {db['runs']} |")
    for runner in RUNNERS:
        if f"{runner}_max_over_none" in result:
            lines.append(f"\n{runner}: accel=max / accel=none = {result[f'{runner}_max_over_none']:.2f}x")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m drivebench.openmmlab.compare SWEEP_DIR", file=sys.stderr)
        return 2
    sweep = Path(args[0])
    result = compare(sweep)
    text = render(result)
    (sweep / "compare.md").write_text(text)
    (sweep / "compare.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
