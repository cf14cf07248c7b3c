"""Hard voxelisation by sorting: mmcv's ``Voxelization`` results in O(N log N) instead of O(N^2).

Why: mmcv 2.1.0's deterministic CUDA hard voxelisation finds each point's voxel-mates by scanning
every earlier point (``point_to_voxelidx_kernel``), then numbers the voxels in a single GPU thread.
For a nuScenes PointPillars sample (10 LiDAR sweeps) that is the data preprocessor's 0.164 s of a
0.265 s step at ``accel=max`` on the H200, in mmengine's runner and in drivebench alike
(experiments/results/h200-2026-11-30-b11).

Same result as mmcv (tested against its CPU op, which implements the same rules with a grid lookup):
a point's voxel is ``floor((p - range_min) / voxel_size)`` in float32, points outside the grid are
dropped, voxels are numbered in the order of their first point, each keeps its first
``max_num_points`` points in input order, voxels past ``max_voxels`` are dropped with their points,
and coordinates come out as (z, y, x) int32.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

VOXELIZERS = ("mmcv", "sorted")


def hard_voxelize(points: torch.Tensor, voxel_size: Sequence[float], point_cloud_range: Sequence[float],
                  max_points: int, max_voxels: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(voxels (M, max_points, C), coors (M, 3) zyx int32, num_points (M,) int32) as mmcv's op."""
    device = points.device
    size = torch.tensor(voxel_size, dtype=torch.float32, device=device)
    low = torch.tensor(point_cloud_range[:3], dtype=torch.float32, device=device)
    high = torch.tensor(point_cloud_range[3:], dtype=torch.float32, device=device)
    grid = torch.round((high - low) / size).long()
    cell = torch.floor((points[:, :3].float() - low) / size).long()  # (N, 3) xyz
    inside = ((cell >= 0) & (cell < grid)).all(dim=1)
    index = inside.nonzero().squeeze(1)  # input order
    cell = cell[index]
    key = (cell[:, 2] * grid[1] + cell[:, 1]) * grid[0] + cell[:, 0]
    key, order = torch.sort(key, stable=True)  # within a voxel, points stay in input order
    index = index[order]
    starts = torch.ones_like(key, dtype=torch.bool)
    starts[1:] = key[1:] != key[:-1]
    segment = torch.cumsum(starts, 0) - 1  # which voxel (in key order) each sorted point is in
    start_pos = starts.nonzero().squeeze(1)
    rank = torch.arange(key.numel(), device=device) - start_pos[segment]  # position within its voxel
    first = index[start_pos]  # each voxel's first point (smallest input index, the sort is stable)
    voxel_of_segment = torch.empty_like(first)
    voxel_of_segment[torch.argsort(first)] = torch.arange(first.numel(), device=device)
    voxel = voxel_of_segment[segment]
    keep = (rank < max_points) & (voxel < max_voxels)
    num_voxels = min(first.numel(), max_voxels)
    voxels = points.new_zeros(num_voxels, max_points, points.size(1))
    voxels[voxel[keep], rank[keep]] = points[index[keep]]
    num_points = torch.zeros(num_voxels, dtype=torch.int32, device=device)
    num_points.index_add_(0, voxel[keep], torch.ones_like(voxel[keep], dtype=torch.int32))
    coors = torch.empty(num_voxels, 3, dtype=torch.int32, device=device)
    seg_kept = voxel_of_segment < max_voxels
    coors[voxel_of_segment[seg_kept]] = cell[order[start_pos[seg_kept]]].flip(1).int()
    return voxels, coors, num_points


class SortedVoxelization(nn.Module):
    """Drop-in for ``mmcv.ops.Voxelization`` (hard voxelisation) computed by :func:`hard_voxelize`."""

    def __init__(self, voxel_size: Sequence[float], point_cloud_range: Sequence[float], max_num_points: int,
                 max_voxels: int | Sequence[int] = 20000) -> None:
        super().__init__()
        if max_num_points <= 0:
            raise ValueError("SortedVoxelization is hard voxelisation: max_num_points must be positive")
        self.voxel_size = list(voxel_size)
        self.point_cloud_range = list(point_cloud_range)
        self.max_num_points = max_num_points
        self.max_voxels = tuple(max_voxels) if isinstance(max_voxels, (tuple, list)) else (max_voxels, max_voxels)

    @classmethod
    def like(cls, layer: nn.Module) -> "SortedVoxelization":
        """The same settings as an mmcv ``Voxelization`` layer."""
        return cls(layer.voxel_size, layer.point_cloud_range, layer.max_num_points, layer.max_voxels)

    def forward(self, points: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        max_voxels = self.max_voxels[0] if self.training else self.max_voxels[1]
        return hard_voxelize(points, self.voxel_size, self.point_cloud_range, self.max_num_points, max_voxels)

    def extra_repr(self) -> str:
        return (f"voxel_size={self.voxel_size}, point_cloud_range={self.point_cloud_range}, "
                f"max_num_points={self.max_num_points}, max_voxels={self.max_voxels}")
