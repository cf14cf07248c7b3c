"""``python -m drivebench.openmmlab.voxel_bench``: mmcv's hard voxelisation vs the sorted one, timed.

A LiDAR-like cloud (dense near the sensor, sparse far out) of ``--points`` points with nuScenes
PointPillars' voxel settings, on CUDA when there is a GPU, else on the CPU (where mmcv's op is a
linear grid lookup, so the CPU ratio says nothing about the GPU, whose deterministic op is quadratic).
Prints per-call medians with [p10, p90] over ``--repeats`` calls after ``--warmup`` calls, and checks
that both give the same voxels.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Callable

import torch

from drivebench.openmmlab import require
from drivebench.perf.stats import describe

VOXEL_SIZE = [0.25, 0.25, 8.0]  # pointpillars_hv_fpn_nus
POINT_CLOUD_RANGE = [-50.0, -50.0, -5.0, 50.0, 50.0, 3.0]
MAX_POINTS, MAX_VOXELS = 64, (30000, 40000)


def lidar_like(num_points: int, device: torch.device, seed: int = 0) -> torch.Tensor:
    """(N, 5) x, y, z, intensity, time: ranges exponential around the sensor, a ground-ish z."""
    g = torch.Generator().manual_seed(seed)
    rng = torch.empty(num_points).exponential_(1 / 15.0, generator=g).clamp(max=70)
    angle = torch.rand(num_points, generator=g) * 2 * torch.pi
    z = torch.randn(num_points, generator=g) * 0.8 - 1.0
    extra = torch.rand(num_points, 2, generator=g)
    pts = torch.stack([rng * angle.cos(), rng * angle.sin(), z], 1)
    return torch.cat([pts, extra], 1).to(device)


def time_calls(fn: Callable[[], object], warmup: int, repeats: int, device: torch.device) -> list[float]:
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return times


def summary(times: list[float]) -> str:
    d = describe(times)
    return f"{d['median'] * 1e3:9.2f} ms [{d['p10'] * 1e3:.2f}, {d['p90'] * 1e3:.2f}]"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=300_000, help="points per cloud (nuScenes, 10 sweeps: ~300k)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    require("drivebench.openmmlab.voxel_bench")
    from mmcv.ops import Voxelization

    from drivebench.openmmlab.voxelize import SortedVoxelization

    device = torch.device(args.device)
    points = lidar_like(args.points, device)
    mmcv_layer = Voxelization(VOXEL_SIZE, POINT_CLOUD_RANGE, MAX_POINTS, MAX_VOXELS).train()
    sorted_layer = SortedVoxelization.like(mmcv_layer).train()
    same = all(torch.equal(a, b) for a, b in zip(mmcv_layer(points), sorted_layer(points)))
    print(f"voxelisation of {args.points} points on {device} ({torch.cuda.get_device_name(device) if device.type == 'cuda' else 'CPU'}), "
          f"{args.repeats} calls after {args.warmup}: same voxels: {same}")
    results = {}
    for name, layer in (("mmcv", mmcv_layer), ("sorted", sorted_layer)):
        results[name] = time_calls(lambda: layer(points), args.warmup, args.repeats, device)
        print(f"  {name:7s} {summary(results[name])}")
    ratio = describe(results["mmcv"])["median"] / describe(results["sorted"])["median"]
    print(f"  mmcv / sorted (medians): {ratio:.2f}x")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
