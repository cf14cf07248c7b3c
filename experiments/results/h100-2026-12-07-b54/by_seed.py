"""val minFDE at epochs 2 and 3 by variant and seed (none, max, the b53 defaults, b54 fp32): python by_seed.py, runs in /tmp/qq."""
import sys, re, statistics
sys.path.insert(0, "experiments/results/cpu2core-2026-12-06-qcnet-lag-by-variant")
from pathlib import Path
from lag_by_variant import qcnet_runs, variant
rows = {}
for name, val, _ in qcnet_runs(Path("/tmp/qq")):
    if variant(name) is None:  # another schedule (bench55)
        continue
    seed = re.search(r"_s(20\d\d)", name)
    rows.setdefault((variant(name), seed.group(1) if seed else "?"), []).append([round(v, 2) for v in val["value"]])
for (v, s), curves in sorted(rows.items()):
    if v in ("none", "max, fp32 with TF32 off (b54)", "max, GRU and output heads in fp32 (b53, the defaults)", "max"):
        ep2 = [c[1] for c in curves if len(c) > 1]; ep3 = [c[2] for c in curves if len(c) > 2]
        print(f"{v[:40]:40s} {s} runs={len(curves)} e2 {statistics.mean(ep2) if ep2 else float('nan'):.2f} e3 {statistics.mean(ep3) if ep3 else float('nan'):.2f}  {curves if len(curves) < 4 else ''}")
