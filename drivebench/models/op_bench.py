"""``python -m drivebench.models.op_bench``: the plain-PyTorch replacements of upstream's CUDA ops, alone.

At the paper shapes, each op's implementations side by side: the work each does (multiply-adds of
the sparse convolution, (Gaussian, voxel) pairs of the splatting, sampled values the deformable
aggregation builds), and where ``--time`` is given the forward + backward time (median [p10, p90]
over ``--repeats`` calls after ``--warmup``) and the peak device memory of one call.

* ``conv``: GaussianFormer's submanifold 5^3 convolution over gs25600's initial Gaussians (uniform in
  the 200x200x16 grid, as the lifter draws them), C=128: ``rulebook`` vs ``dense``.
* ``splat``: gs25600's splatting (scales uniform in [0.08, 0.64] m, 18 channels): ``radius`` vs ``max``.
* ``agg``: the deformable aggregation at SparseDrive's map head (batch 6, 100 anchors x 300
  keypoints, 6 cameras, 4 levels of a 256x704 input, C=256) and GaussianFormer gs25600 (25,600 x 9
  keypoints, 4 levels of 864x1600, C=128): ``grid_sample`` vs ``chunked`` vs ``compiled``.

The work figures need no timing and run anywhere (``--what conv,splat`` without ``--time`` on a
CPU builds only the rulebook). Timings belong to the GPU (``scripts/device/bench17.sh``).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Callable

import torch

from drivebench.perf.stats import describe

GRID_SHAPE, GRID_LOWER, VOXEL = (200, 200, 16), (-50.0, -50.0, -5.0), 0.5


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_calls(fn: Callable[[], object], warmup: int, repeats: int, device: torch.device) -> dict[str, float]:
    """Median/p10/p90 seconds of ``fn`` and its peak device memory (GiB; NaN on the CPU)."""
    for _ in range(warmup):
        fn()
    _sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    stats = describe(times)
    peak = (torch.cuda.max_memory_allocated(device) - base) / 2**30 if device.type == "cuda" else float("nan")
    return {"median": stats["median"], "p10": stats["p10"], "p90": stats["p90"], "peak_gib": peak}


def _fmt(t: dict[str, float]) -> str:
    return (f"{t['median'] * 1e3:9.2f} ms [{t['p10'] * 1e3:.2f}, {t['p90'] * 1e3:.2f}]  "
            f"peak {t['peak_gib']:.2f} GiB above the inputs")


def _fwd_bwd(fn: Callable[..., torch.Tensor], inputs: list[torch.Tensor]) -> Callable[[], None]:
    grad_inputs = [t for t in inputs if t.requires_grad]

    def step() -> None:
        out = fn()
        torch.autograd.grad(out.float().square().mean(), grad_inputs)
    return step


def bench_conv(device: torch.device, args: argparse.Namespace) -> None:
    from drivebench.models.gaussianformer.sparse_conv import build_rulebook, submanifold_conv3d

    gen = torch.Generator().manual_seed(0)
    m, c = args.gaussians, 128
    coords = torch.stack([torch.randint(0, n, (m,), generator=gen) for n in GRID_SHAPE], -1).to(device)
    batch = torch.zeros(m, dtype=torch.long, device=device)
    _, book = build_rulebook(coords, batch, GRID_SHAPE, 5)
    macs = book.macs(c, c)
    print(f"sparse conv 5^3, {m} Gaussians in {book.num_voxels} voxels, C={c}: "
          f"{book.num_pairs / max(book.num_voxels, 1):.2f} occupied neighbours per voxel (besides itself)")
    print(f"  forward MACs  dense (all 125 offsets): {macs['dense_window'] / 1e9:7.2f} G")
    print(f"                rulebook as run (padded to {book.cap} pairs per offset): {macs['rulebook_padded'] / 1e9:7.2f} G")
    print(f"                spconv's exact pairs: {macs['pairs_exact'] / 1e9:7.2f} G")
    print(f"  work ratio dense / rulebook: {macs['dense_window'] / macs['rulebook_padded']:.1f}x "
          f"(dense / exact pairs: {macs['dense_window'] / macs['pairs_exact']:.1f}x)")
    if not args.time:
        return
    features = torch.randn(m, c, device=device, requires_grad=True)
    weight = (torch.randn(125, c, c, device=device) * 0.01).requires_grad_()
    for impl in ("rulebook", "dense"):
        step = _fwd_bwd(lambda: submanifold_conv3d(features, coords, batch, weight, GRID_SHAPE, impl=impl),
                        [features, weight])
        print(f"  {impl:9s} fwd+bwd {_fmt(time_calls(step, args.warmup, args.repeats, device))}")


def bench_splat(device: torch.device, args: argparse.Namespace) -> None:
    import torch.nn.functional as F

    from drivebench.models.gaussianformer.geometry import GridSpec
    from drivebench.models.gaussianformer.splat import splat_gaussians, window_radius

    gen = torch.Generator().manual_seed(1)
    g, c = args.gaussians, 18
    grid = GridSpec(GRID_SHAPE, GRID_LOWER, VOXEL)
    lo, hi = torch.tensor(grid.lower), torch.tensor(grid.upper)
    means = (lo + torch.rand(1, g, 3, generator=gen) * (hi - lo)).to(device).requires_grad_()
    scales = (0.08 + 0.56 * torch.rand(1, g, 3, generator=gen)).to(device).requires_grad_()
    rotations = F.normalize(torch.randn(1, g, 4, generator=gen), dim=-1).to(device).requires_grad_()
    opacities = torch.rand(1, g, generator=gen).to(device).requires_grad_()
    semantics = torch.rand(1, g, c, generator=gen).to(device).requires_grad_()
    r_max = window_radius(0.64, VOXEL)
    radius = torch.ceil(scales.detach().amax(-1) * 3.0 / VOXEL).long().clamp(1, r_max)
    own = int(((2 * radius + 1) ** 3).sum())
    fixed = g * (2 * r_max + 1) ** 3
    print(f"splatting, {g} Gaussians (scales uniform in [0.08, 0.64] m), {c} channels: (Gaussian, voxel) pairs "
          f"radius {own / 1e6:.1f}M, max {fixed / 1e6:.1f}M ({fixed / own:.2f}x)")
    if not args.time:
        return
    inputs = [means, scales, rotations, opacities, semantics]
    for window in ("radius", "max"):
        step = _fwd_bwd(lambda: splat_gaussians(*inputs, grid, r_max, window=window), inputs)
        print(f"  {window:9s} fwd+bwd {_fmt(time_calls(step, args.warmup, args.repeats, device))}")


AGG_SHAPES = {  # b, q, p, cams, c, groups, levels (h, w)
    "sparsedrive_map": (6, 100, 300, 6, 256, 8, ((64, 176), (32, 88), (16, 44), (8, 22))),
    "gaussianformer": (1, 25600, 9, 6, 128, 4, ((108, 200), (54, 100), (27, 50), (14, 25))),
}


def bench_agg(device: torch.device, args: argparse.Namespace) -> None:
    from drivebench.models.ops import deformable_aggregation, masked_point_softmax

    for name in args.agg_shapes.split(","):
        b, q, p, n, c, g, levels = AGG_SHAPES[name]
        q = args.agg_queries or q
        samples = b * n * c * q * p
        print(f"deformable aggregation, {name}: B={b} Q={q} P={p} cams={n} C={c}: grid_sample builds "
              f"{samples / 1e6:.0f}M sampled values per level ({len(levels)} levels), kept for backward")
        if not args.time:
            continue
        gen = torch.Generator().manual_seed(2)
        feats = [torch.randn(b, n, c, h, w, generator=gen).to(device).requires_grad_() for h, w in levels]
        points = torch.rand(b, q, p, n, 2, generator=gen).to(device).requires_grad_()
        logits = torch.randn(b, q, p, n, len(levels), g, generator=gen).to(device)
        visible = (torch.rand(b, q, p, n, generator=gen) > 0.6).to(device)
        weights = masked_point_softmax(logits, visible).requires_grad_()
        inputs = [*feats, points, weights]
        for impl in args.agg_impls.split(","):
            step = _fwd_bwd(lambda: deformable_aggregation(feats, points, weights, impl=impl), inputs)
            try:
                print(f"  {impl:11s} fwd+bwd {_fmt(time_calls(step, args.warmup, args.repeats, device))}")
            except torch.OutOfMemoryError:
                print(f"  {impl:11s} out of memory")
                torch.cuda.empty_cache()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--what", default="conv,splat,agg", help="comma list of conv, splat, agg")
    parser.add_argument("--time", action="store_true", help="time forward + backward (meant for the GPU)")
    parser.add_argument("--gaussians", type=int, default=25600)
    parser.add_argument("--agg-shapes", default="sparsedrive_map,gaussianformer")
    parser.add_argument("--agg-impls", default="grid_sample,chunked,compiled")
    parser.add_argument("--agg-queries", type=int, default=0, help="override the queries (0: the model's)")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"op_bench on {device} ({where}), torch {torch.__version__}"
          + (f", {args.repeats} calls after {args.warmup} warm-up" if args.time else ", work counts only"))
    benches = {"conv": bench_conv, "splat": bench_splat, "agg": bench_agg}
    for what in args.what.split(","):
        benches[what](device, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
