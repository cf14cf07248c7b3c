"""The first epoch's train/loss (250 steps) of QCNet accel=max with compiled layers (this part) against
accel=none (fp32, h200-2026-12-01-b18/part3): window means, per-point differences and a plot.
python experiments/results/h200-2026-12-02-b28/first_epoch_loss.py <max run dir> <none run dir> <out stem>"""
import sys

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def curve(run: str) -> dict[int, float]:
    acc = EventAccumulator(f"{run}/tb", size_guidance={"scalars": 0})
    acc.Reload()
    tags = acc.Tags()["scalars"]
    tag = "fit/train/loss" if "fit/train/loss" in tags else "train/loss"  # phase-prefixed since 2026-12-02
    return {e.step: e.value for e in acc.Scalars(tag)}


mx, nn_ = curve(sys.argv[1]), curve(sys.argv[2])
steps = sorted(s for s in mx if s in nn_ and s < 260)
a, b = np.array([mx[s] for s in steps]), np.array([nn_[s] for s in steps])
lines = [f"steps {steps[0]} - {steps[-1]}, {len(steps)} logged points in both"]
for lo, hi in ((0, 60), (60, 130), (130, 200), (200, 260)):
    m = [(x, y) for s, x, y in zip(steps, a, b) if lo <= s < hi]
    x, y = np.mean([p[0] for p in m]), np.mean([p[1] for p in m])
    rel = np.median([abs(p[0] - p[1]) / p[1] for p in m])
    lines.append(f"steps {lo}-{hi}: mean loss max {x:.3f} none {y:.3f} rel diff {(x - y) / y:+.3f}; per-point |rel| median {rel:.3f}")
print("\n".join(lines))
open(f"{sys.argv[3]}.txt", "w").write("\n".join(lines) + "\n")
plt.figure(figsize=(7, 4))
plt.plot(steps, b, label="accel=none (fp32, eager)")
plt.plot(steps, a, label="accel=max (bf16, compiled layers, CUDA graphs)")
plt.yscale("log"); plt.xlabel("step"); plt.ylabel("train/loss"); plt.legend(); plt.title("QCNet, first epoch, seed 2023, H200")
plt.tight_layout(); plt.savefig(f"{sys.argv[3]}.png", dpi=110)
