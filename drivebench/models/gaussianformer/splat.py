"""Gaussian-to-voxel splatting (upstream ``local_aggregate`` CUDA op) in plain PyTorch.

For every voxel centre x: out(x) = sum_g o_g * exp(-1/2 (x - mu_g)^T Sigma_g^-1 (x - mu_g)) * s_g, over
the Gaussians g whose window reaches x. As upstream, the window is Gaussian-centric: the box of voxels
within r_g = ceil(3 * max(scale_g) / voxel) voxel indices of the voxel holding mu_g (scales detached).

Enumeration uses a fixed window of r_max (from the largest possible scale) so every shape is static
and nothing syncs with the host; voxels beyond r_g or outside the grid get weight 0. The custom
autograd function runs over chunks of Gaussians in forward and recomputes the same chunks in backward,
so peak memory is O(chunk_pairs * C) whatever the number of Gaussians, and nothing per pair is kept.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from drivebench.models.gaussianformer.geometry import GridSpec, cube_offsets, precision_matrix, voxel_index

DEFAULT_CHUNK_PAIRS = 1 << 22  # (Gaussian, voxel) pairs per chunk: ~4.2M pairs, a few hundred MB at C=18


def window_radius(max_scale: float, voxel_size: float, scale_multiplier: float = 3.0) -> int:
    """Largest per-Gaussian window radius (in voxels) a Gaussian of scale <= ``max_scale`` can need."""
    return max(1, math.ceil(max_scale * scale_multiplier / voxel_size - 1e-6))


class _PairGeometry:
    """Voxel index, centre offset and validity of every (Gaussian, window voxel) pair of one chunk.

    Built axis by axis so no (m, K, 3) integer tensor is materialised (it would dominate the chunk's memory).
    """

    def __init__(self, means: torch.Tensor, centre: torch.Tensor, radius: torch.Tensor, batch: torch.Tensor,
                 offsets: torch.Tensor, grid: GridSpec) -> None:
        self.valid = offsets.abs().amax(-1) <= radius.unsqueeze(1)  # (m, K): inside the Gaussian's window
        index = batch.unsqueeze(1)
        deltas = []
        for axis in range(3):
            n = grid.shape[axis]
            coord = centre[:, axis:axis + 1] + offsets[:, axis]  # (m, K)
            self.valid = self.valid & (coord >= 0) & (coord < n)
            coord = coord.clamp(0, n - 1)
            index = index * n + coord
            centre_m = (coord.to(means.dtype) + 0.5) * grid.voxel_size + grid.lower[axis]
            deltas.append(centre_m - means[:, axis:axis + 1])
        self.index = index
        self.delta = torch.stack(deltas, dim=-1)  # (m, K, 3) voxel centre - mean


class _SplatFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, means: torch.Tensor, precision: torch.Tensor, opacity: torch.Tensor,
                semantics: torch.Tensor, centre: torch.Tensor, radius: torch.Tensor, batch: torch.Tensor,
                offsets: torch.Tensor, grid: GridSpec, batch_size: int, chunk: int) -> torch.Tensor:
        m, c = semantics.shape
        out = means.new_zeros(batch_size * grid.num_voxels, c)
        for s in range(0, m, chunk):
            sl = slice(s, s + chunk)
            geo = _PairGeometry(means[sl], centre[sl], radius[sl], batch[sl], offsets, grid)
            pd = torch.einsum("mij,mkj->mki", precision[sl], geo.delta)
            density = torch.exp(-0.5 * (geo.delta * pd).sum(-1)) * geo.valid
            weight = density * opacity[sl].unsqueeze(1)
            contrib = weight.unsqueeze(-1) * semantics[sl].unsqueeze(1)
            out.index_add_(0, geo.index.reshape(-1), contrib.reshape(-1, c))
        ctx.save_for_backward(means, precision, opacity, semantics, centre, radius, batch, offsets)
        ctx.grid, ctx.chunk = grid, chunk
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        with torch.autocast(device_type=grad_out.device.type, enabled=False):
            return _SplatFunction._backward(ctx, grad_out.float())

    @staticmethod
    def _backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        means, precision, opacity, semantics, centre, radius, batch, offsets = ctx.saved_tensors
        need_mean, need_prec, need_opa, need_sem = ctx.needs_input_grad[:4]
        grad_out = grad_out.contiguous()
        m, c = semantics.shape
        g_mean = torch.zeros_like(means) if need_mean else None
        g_prec = torch.zeros_like(precision) if need_prec else None
        g_opa = torch.zeros_like(opacity) if need_opa else None
        g_sem = torch.zeros_like(semantics) if need_sem else None
        for s in range(0, m, ctx.chunk):
            sl = slice(s, s + ctx.chunk)
            geo = _PairGeometry(means[sl], centre[sl], radius[sl], batch[sl], offsets, ctx.grid)
            pd = torch.einsum("mij,mkj->mki", precision[sl], geo.delta)
            density = torch.exp(-0.5 * (geo.delta * pd).sum(-1)) * geo.valid
            weight = density * opacity[sl].unsqueeze(1)
            g_voxel = grad_out[geo.index.reshape(-1)].view(*geo.index.shape, c)  # dL/dout at each pair
            if g_sem is not None:
                g_sem[sl] = torch.einsum("mk,mkc->mc", weight, g_voxel)
            g_weight = torch.einsum("mkc,mc->mk", g_voxel, semantics[sl])
            if g_opa is not None:
                g_opa[sl] = (density * g_weight).sum(-1)
            g_power = weight * g_weight  # dL/dq with q = -1/2 d^T P d
            if g_mean is not None:  # dq/dmu = P d
                g_mean[sl] = torch.einsum("mk,mki->mi", g_power, pd)
            if g_prec is not None:  # dq/dP = -1/2 d d^T
                g_prec[sl] = -0.5 * torch.einsum("mki,mkj->mij", g_power.unsqueeze(-1) * geo.delta, geo.delta)
        return g_mean, g_prec, g_opa, g_sem, None, None, None, None, None, None, None


def splat_gaussians(
    means: torch.Tensor,
    scales: torch.Tensor,
    rotations: torch.Tensor,
    opacities: torch.Tensor,
    semantics: torch.Tensor,
    grid: GridSpec,
    max_radius: int,
    scale_multiplier: float = 3.0,
    chunk_pairs: int = DEFAULT_CHUNK_PAIRS,
) -> torch.Tensor:
    """Splat batched Gaussians onto ``grid``; returns (B, X*Y*Z, C) in float32.

    Args:
        means, scales: (B, G, 3) metres; rotations (B, G, 4) quaternions; opacities (B, G);
            semantics (B, G, C).
        max_radius: window radius r_max in voxels (``window_radius`` of the largest scale); per-Gaussian
            radii above it are clipped to it.
        chunk_pairs: (Gaussian, window voxel) pairs processed at once; bounds peak memory.
    """
    b, g, _ = means.shape
    device = means.device
    with torch.autocast(device_type=device.type, enabled=False):
        means, scales, rotations = means.float(), scales.float(), rotations.float()
        precision = precision_matrix(scales, rotations).reshape(b * g, 3, 3)
        flat_means = means.reshape(b * g, 3)
        centre = voxel_index(flat_means.detach(), grid.lower, grid.voxel_size, grid.shape)
        radius = torch.ceil(scales.detach().amax(-1).reshape(-1) * scale_multiplier / grid.voxel_size).long()
        radius = radius.clamp(1, max_radius)
        batch = torch.arange(b, device=device).repeat_interleave(g)
        offsets = cube_offsets(max_radius, device)
        chunk = max(1, chunk_pairs // offsets.shape[0])
        out = _SplatFunction.apply(
            flat_means, precision, opacities.float().reshape(b * g), semantics.float().reshape(b * g, -1),
            centre, radius, batch, offsets, grid, b, chunk,
        )
    return out.view(b, grid.num_voxels, -1)
