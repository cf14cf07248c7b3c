"""How far each deformable-aggregation implementation lands from float64 when the features are bf16 (as under
`accel=max`'s autocast) and the keypoints float32. `grid_sample` takes one dtype for features and grid; until
2026-12-07 `_sample_and_mix` cast the grid to the features' bf16, moving a keypoint by up to 1/512 of the map
(0.17 px at 176 columns): the `bf16 grid` line, that rounding alone (rms 1.5% of the output on smooth maps, 7.7% on
white noise; on the CPU, whose bf16 kernel also interpolates in bf16, this script's `grid_sample` line printed 4.4%
and 33%). Since, it samples bf16 features in float32 and casts the samples back (0.37%, 0.43%; `compiled`'s corner
gathers 0.24%, 0.33%). Prints one line per (features, implementation): max and rms error against float64, relative
to the output's rms, and the floor that the features' own bf16 rounding sets (0.10%, 0.17%).

    python scripts/aggregation_precision.py [--device cpu|cuda] [--queries 900]

Shapes: SparseDrive small (6 cameras, 256 channels, 8 groups, 4 levels of a 256x704 input, 13 keypoints). Two
feature kinds: white noise (neighbouring pixels independent: the worst case for a moved keypoint) and smooth
(noise upsampled 8x: nearer a trained FPN's maps).
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from drivebench.models.ops.deformable_aggregation import corner_gather_aggregation, deformable_aggregation

LEVELS = [(64, 176), (32, 88), (16, 44), (8, 22)]  # stride 4..32 of 256x704
CAMS, CHANNELS, GROUPS, KEYPOINTS = 6, 256, 8, 13


def features(kind: str, device: str, gen: torch.Generator) -> list[torch.Tensor]:
    out = []
    for h, w in LEVELS:
        if kind == "noise":
            f = torch.randn(1, CAMS, CHANNELS, h, w, generator=gen)
        else:
            low = torch.randn(CAMS, CHANNELS, max(h // 8, 2), max(w // 8, 2), generator=gen)
            f = F.interpolate(low, size=(h, w), mode="bicubic", align_corners=False).unsqueeze(0)
        out.append(f.to(device))
    return out


def error_line(kind: str, name: str, out: torch.Tensor, ref: torch.Tensor, note: str) -> str:
    """Max and rms error of ``out`` against ``ref``, relative to ``ref``'s rms."""
    scale = ref.pow(2).mean().sqrt().item()
    err = out.double() - ref
    return (f"{kind:6s} bf16 features  {name:11s}  max {err.abs().max().item() / scale:.2e}  "
            f"rms {err.pow(2).mean().sqrt().item() / scale:.2e}  ({note})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--queries", type=int, default=900)
    args = parser.parse_args()
    gen = torch.Generator().manual_seed(0)
    q = args.queries
    points = (torch.rand(1, q, KEYPOINTS, CAMS, 2, generator=gen) * 1.2 - 0.1).to(args.device)
    logits = torch.randn(1, q, KEYPOINTS * CAMS * len(LEVELS), GROUPS, generator=gen)
    weights = torch.softmax(logits, dim=2).view(1, q, KEYPOINTS, CAMS, len(LEVELS), GROUPS).to(args.device)
    weights64 = weights.double()
    for kind in ("noise", "smooth"):
        feats = features(kind, args.device, gen)
        ref = corner_gather_aggregation([f.double() for f in feats], points.double(), weights64)
        low = [f.bfloat16() for f in feats]
        rounded = [f.double() for f in low]
        # grid_sample before 2026-12-07: keypoints rounded to a bf16 grid, the sampling itself exact (a GPU kernel
        # computes in float32; the CPU's bf16 kernel adds its own rounding on top)
        bf16_grid = ((2.0 * points - 1.0).bfloat16().double() + 1.0) / 2.0
        rows = [
            ("grid_sample", deformable_aggregation(low, points, weights, impl="grid_sample"), "as the op runs now"),
            ("compiled", corner_gather_aggregation(low, points, weights), "the corner gathers, eager"),
            ("bf16 grid", corner_gather_aggregation(rounded, bf16_grid, weights64),
             "the old grid_sample's keypoint rounding alone"),
            ("floor", corner_gather_aggregation(rounded, points.double(), weights64),
             "features rounded, all else float64"),
        ]
        for name, out, note in rows:
            print(error_line(kind, name, out, ref, note))


if __name__ == "__main__":
    main()
