"""Submanifold sparse 3D convolution among Gaussians, in plain PyTorch (replaces spconv ``SubMConv3d``).

Gaussian means are voxelised; every occupied voxel gets an output computed from the occupied voxels
in its k^3 neighbourhood only (submanifold: the sparsity pattern does not dilate). Neighbours are found
by sorting the voxel keys and ``searchsorted`` (no hash table, no host sync); the convolution is
gather -> GEMM -> (in backward) scatter with ``index_add_``, chunked over kernel offsets, inside a
custom autograd function so no (voxels x k^3 x C) tensor is kept for backward.

Several Gaussians in one voxel: spconv keeps one arbitrary representative of the duplicates in its
hash table; here the voxel's input is the mean of their features (deterministic), and every Gaussian
reads its voxel's output. With one Gaussian per voxel the two are identical.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import nn

from drivebench.models.gaussianformer.geometry import cube_offsets, inside_grid, linear_voxel_index, voxel_index

_EMPTY_KEY = torch.iinfo(torch.int64).max  # larger than any real key: keeps unused slots at the end


def kernel_offsets(kernel_size: int, device: torch.device | None = None) -> torch.Tensor:
    """(k^3, 3) integer offsets in lexicographic (dx, dy, dz) order, from -r to r (matches conv3d weight order)."""
    return cube_offsets(kernel_size // 2, device)


class VoxelNeighbours:
    """Unique occupied voxels of a point set and, for each, the slot of every neighbour in a k^3 window.

    All tensors have fixed sizes (M slots for M points; slots past the number of distinct voxels are
    unused), so building this needs no device-to-host synchronisation.

    Attributes:
        slot_of_point: (M,) slot (distinct voxel) of each input point.
        count: (M,) number of points per slot (0 for unused slots).
        neighbours: (M, k^3) slot of the neighbour at each kernel offset, -1 where unoccupied.
    """

    def __init__(self, coords: torch.Tensor, batch_index: torch.Tensor, spatial_shape: Sequence[int],
                 kernel_size: int) -> None:
        m = coords.shape[0]
        device = coords.device
        keys = linear_voxel_index(coords, spatial_shape, batch_index)
        sorted_keys, order = torch.sort(keys)
        is_new = torch.ones_like(sorted_keys, dtype=torch.bool)
        is_new[1:] = sorted_keys[1:] != sorted_keys[:-1]
        slot_sorted = torch.cumsum(is_new.long(), 0) - 1
        self.slot_of_point = torch.empty_like(slot_sorted).scatter_(0, order, slot_sorted)
        slot_keys = torch.full((m,), _EMPTY_KEY, dtype=torch.long, device=device).scatter_(0, slot_sorted, sorted_keys)
        self.count = torch.zeros(m, dtype=torch.long, device=device).index_add_(
            0, self.slot_of_point, torch.ones_like(self.slot_of_point)
        )
        used = self.count > 0

        sx, sy, sz = spatial_shape
        safe_keys = torch.where(used, slot_keys, torch.zeros_like(slot_keys))
        slot_coords = torch.stack([(safe_keys // (sz * sy)) % sx, (safe_keys // sz) % sy, safe_keys % sz], dim=-1)
        slot_batch = safe_keys // (sz * sy * sx)

        nb = slot_coords.unsqueeze(1) + kernel_offsets(kernel_size, device).unsqueeze(0)  # (M, K, 3)
        inside = inside_grid(nb, spatial_shape) & used.unsqueeze(1)
        nb_keys = linear_voxel_index(nb, spatial_shape, slot_batch.unsqueeze(1))
        pos = torch.searchsorted(slot_keys, nb_keys).clamp(max=m - 1)
        found = inside & (slot_keys[pos] == nb_keys)
        self.neighbours = torch.where(found, pos, torch.full_like(pos, -1))


class _GatherConv(torch.autograd.Function):
    """out[s] = sum_k W_k^T x[nbr[s, k]] over occupied neighbours; chunked over kernel offsets."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, neighbours: torch.Tensor, chunk: int) -> torch.Tensor:
        m, c_in = x.shape
        k, _, c_out = weight.shape
        out = x.new_zeros(m, c_out)
        for start in range(0, k, chunk):
            idx = neighbours[:, start:start + chunk]
            valid = (idx >= 0).unsqueeze(-1).to(x.dtype)
            gathered = x[idx.clamp(min=0)] * valid  # (M, kc, C_in)
            out += gathered.reshape(m, -1) @ weight[start:start + chunk].reshape(-1, c_out)
        ctx.save_for_backward(x, weight, neighbours)
        ctx.chunk = chunk
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight, neighbours = ctx.saved_tensors
        chunk = ctx.chunk
        m, c_in = x.shape
        k, _, c_out = weight.shape
        grad_out = grad_out.contiguous()
        grad_x = torch.zeros_like(x) if ctx.needs_input_grad[0] else None
        grad_w = torch.zeros_like(weight) if ctx.needs_input_grad[1] else None
        for start in range(0, k, chunk):
            idx = neighbours[:, start:start + chunk]
            kc = idx.shape[1]
            valid = (idx >= 0).unsqueeze(-1).to(x.dtype)
            safe_idx = idx.clamp(min=0)
            if grad_w is not None:
                gathered = (x[safe_idx] * valid).reshape(m, -1)
                grad_w[start:start + kc] = (gathered.t() @ grad_out).view(kc, c_in, c_out)
            if grad_x is not None:
                back = (grad_out @ weight[start:start + kc].reshape(-1, c_out).t()).view(m, kc, c_in) * valid
                grad_x.index_add_(0, safe_idx.reshape(-1), back.reshape(-1, c_in))
        return grad_x, grad_w, None, None


def submanifold_conv3d(
    features: torch.Tensor,
    coords: torch.Tensor,
    batch_index: torch.Tensor,
    weight: torch.Tensor,
    spatial_shape: Sequence[int],
    chunk_elements: int = 1 << 26,
) -> torch.Tensor:
    """Submanifold conv of point features (M, C_in) at integer voxel ``coords`` (M, 3) -> (M, C_out).

    ``weight`` is (k^3, C_in, C_out) with offsets in ``kernel_offsets`` order. ``chunk_elements`` bounds
    the gathered (M, k_chunk, C_in) block per GEMM.
    """
    k = weight.shape[0]
    kernel_size = round(k ** (1 / 3))
    if kernel_size ** 3 != k or kernel_size % 2 == 0:
        raise ValueError(f"weight has {k} kernel offsets; expected an odd cube (e.g. 125 for 5^3)")
    nbrs = VoxelNeighbours(coords, batch_index, spatial_shape, kernel_size)
    m, c_in = features.shape
    slot_features = features.new_zeros(m, c_in).index_add_(0, nbrs.slot_of_point, features)
    slot_features = slot_features / nbrs.count.clamp(min=1).unsqueeze(-1).to(features.dtype)
    chunk = max(1, min(k, chunk_elements // max(1, m * c_in)))
    slot_out = _GatherConv.apply(slot_features, weight.to(features.dtype), nbrs.neighbours, chunk)
    return slot_out[nbrs.slot_of_point]


class GaussianSparseConv(nn.Module):
    """Upstream ``SparseConv3D``: voxelise the Gaussian means on a grid over the scene, apply a bias-free
    submanifold k^3 conv to the instance features, then an optional output linear (``use_out_proj``)."""

    def __init__(
        self,
        embed_dims: int,
        scene_lower: Sequence[float],
        scene_upper: Sequence[float],
        voxel_size: float = 0.5,
        kernel_size: int = 5,
        use_out_proj: bool = False,
        chunk_elements: int = 1 << 26,
    ) -> None:
        super().__init__()
        self.scene_lower = tuple(float(v) for v in scene_lower)
        self.voxel_size = float(voxel_size)
        self.spatial_shape = tuple(round((hi - lo) / voxel_size) for lo, hi in zip(scene_lower, scene_upper))
        self.chunk_elements = chunk_elements
        k = kernel_size ** 3
        self.weight = nn.Parameter(torch.empty(k, embed_dims, embed_dims))
        bound = (6.0 / (k * embed_dims + embed_dims)) ** 0.5  # xavier-uniform over (k*C_in, C_out)
        nn.init.uniform_(self.weight, -bound, bound)
        self.output_proj = nn.Linear(embed_dims, embed_dims) if use_out_proj else nn.Identity()

    def voxelise(self, means: torch.Tensor) -> torch.Tensor:
        """Integer voxel coordinates (..., 3) of metric points, clamped into the grid."""
        return voxel_index(means, self.scene_lower, self.voxel_size, self.spatial_shape)

    def forward(self, instance_feature: torch.Tensor, means: torch.Tensor) -> torch.Tensor:
        b, g, c = instance_feature.shape
        coords = self.voxelise(means.detach()).reshape(b * g, 3)
        batch_index = torch.arange(b, device=means.device).repeat_interleave(g)
        out = submanifold_conv3d(instance_feature.reshape(b * g, c), coords, batch_index, self.weight,
                                 self.spatial_shape, self.chunk_elements)
        return self.output_proj(out.view(b, g, -1))
