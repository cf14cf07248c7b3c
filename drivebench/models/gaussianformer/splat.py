"""Gaussian-to-voxel splatting (upstream ``local_aggregate`` CUDA op) in plain PyTorch.

For every voxel centre x: out(x) = sum_g o_g * exp(-1/2 (x - mu_g)^T Sigma_g^-1 (x - mu_g)) * s_g, over
the Gaussians g whose window reaches x. As upstream, the window is Gaussian-centric: the box of voxels
within r_g = ceil(3 * max(scale_g) / voxel) voxel indices of the voxel holding mu_g (scales detached).

Two enumerations (``window``):

* ``radius`` (default, upstream's work): the Gaussians are sorted by r_g and each radius bucket
  enumerates its own (2 r_g + 1)^3 window. The bucket sizes are read on the host once per call (one
  device-to-host synchronisation, as upstream's op, which copies its pair count to the host).
* ``max``: every Gaussian enumerates the r_max window (from the largest possible scale) and the
  voxels beyond its own r_g get weight 0; every shape is static and nothing syncs with the host, at
  (2 r_max + 1)^3 pairs per Gaussian.

Voxels outside the grid get weight 0. The custom autograd function runs over chunks of Gaussians in
forward and recomputes the same chunks in backward, so peak memory is O(chunk_pairs * C) whatever the
number of Gaussians, and nothing per pair is kept.
"""

from __future__ import annotations

import math
from typing import Any, Iterator, NamedTuple, Sequence

import torch

from drivebench.models.gaussianformer.geometry import GridSpec, cube_offsets, precision_matrix, voxel_index

DEFAULT_CHUNK_PAIRS = 1 << 22  # (Gaussian, voxel) pairs per chunk: ~4.2M pairs, a few hundred MB at C=18
SPLAT_WINDOWS = ("radius", "max")


def window_radius(max_scale: float, voxel_size: float, scale_multiplier: float = 3.0) -> int:
    """Largest per-Gaussian window radius (in voxels) a Gaussian of scale <= ``max_scale`` can need."""
    return max(1, math.ceil(max_scale * scale_multiplier / voxel_size - 1e-6))


class _PairGeometry:
    """Voxel index, centre offset and validity of every (Gaussian, window voxel) pair of one chunk.

    Built axis by axis so no (m, K, 3) integer tensor is materialised (it would dominate the chunk's memory).
    """

    def __init__(self, means: torch.Tensor, centre: torch.Tensor, radius: torch.Tensor | None, batch: torch.Tensor,
                 offsets: torch.Tensor, grid: GridSpec) -> None:
        # (m, K): inside the Gaussian's own window (always, when the window is the Gaussian's radius bucket)
        self.valid = offsets.abs().amax(-1) <= radius.unsqueeze(1) if radius is not None else True
        index = batch.unsqueeze(1)
        deltas = []
        for axis in range(3):
            n = grid.shape[axis]
            coord = centre[:, axis:axis + 1] + offsets[:, axis]  # (m, K)
            self.valid = (coord >= 0) & (coord < n) & self.valid
            coord = coord.clamp(0, n - 1)
            index = index * n + coord
            centre_m = (coord.to(means.dtype) + 0.5) * grid.voxel_size + grid.lower[axis]
            deltas.append(centre_m - means[:, axis:axis + 1])
        self.index = index
        self.delta = torch.stack(deltas, dim=-1)  # (m, K, 3) voxel centre - mean


class _Bucket(NamedTuple):
    """Gaussians ``start:stop`` (in the function's order) enumerate the window of ``window_radius``;
    ``clip`` masks voxels beyond each Gaussian's own radius (``window="max"``)."""

    start: int
    stop: int
    window_radius: int
    clip: bool


def _chunks(buckets: Sequence[_Bucket], chunk_pairs: int, device: torch.device) -> Iterator[tuple[slice, torch.Tensor, bool]]:
    """(Gaussian slice, window offsets, clip) for every chunk of at most ``chunk_pairs`` pairs."""
    for bucket in buckets:
        offsets = cube_offsets(bucket.window_radius, device)
        step = max(1, chunk_pairs // offsets.shape[0])
        for s in range(bucket.start, bucket.stop, step):
            yield slice(s, min(s + step, bucket.stop)), offsets, bucket.clip


class _SplatFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, means: torch.Tensor, precision: torch.Tensor, opacity: torch.Tensor,
                semantics: torch.Tensor, centre: torch.Tensor, radius: torch.Tensor, batch: torch.Tensor,
                buckets: Sequence[_Bucket], grid: GridSpec, batch_size: int, chunk_pairs: int) -> torch.Tensor:
        c = semantics.shape[1]
        out = means.new_zeros(batch_size * grid.num_voxels, c)
        for sl, offsets, clip in _chunks(buckets, chunk_pairs, means.device):
            geo = _PairGeometry(means[sl], centre[sl], radius[sl] if clip else None, batch[sl], offsets, grid)
            pd = torch.einsum("mij,mkj->mki", precision[sl], geo.delta)
            density = torch.exp(-0.5 * (geo.delta * pd).sum(-1)) * geo.valid
            weight = density * opacity[sl].unsqueeze(1)
            contrib = weight.unsqueeze(-1) * semantics[sl].unsqueeze(1)
            out.index_add_(0, geo.index.reshape(-1), contrib.reshape(-1, c))
        ctx.save_for_backward(means, precision, opacity, semantics, centre, radius, batch)
        ctx.grid, ctx.buckets, ctx.chunk_pairs = grid, buckets, chunk_pairs
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        with torch.autocast(device_type=grad_out.device.type, enabled=False):
            return _SplatFunction._backward(ctx, grad_out.float())

    @staticmethod
    def _backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        means, precision, opacity, semantics, centre, radius, batch = ctx.saved_tensors
        need_mean, need_prec, need_opa, need_sem = ctx.needs_input_grad[:4]
        grad_out = grad_out.contiguous()
        c = semantics.shape[1]
        g_mean = torch.zeros_like(means) if need_mean else None
        g_prec = torch.zeros_like(precision) if need_prec else None
        g_opa = torch.zeros_like(opacity) if need_opa else None
        g_sem = torch.zeros_like(semantics) if need_sem else None
        for sl, offsets, clip in _chunks(ctx.buckets, ctx.chunk_pairs, means.device):
            geo = _PairGeometry(means[sl], centre[sl], radius[sl] if clip else None, batch[sl], offsets, ctx.grid)
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
    window: str = "radius",
) -> torch.Tensor:
    """Splat batched Gaussians onto ``grid``; returns (B, X*Y*Z, C) in float32.

    Args:
        means, scales: (B, G, 3) metres; rotations (B, G, 4) quaternions; opacities (B, G);
            semantics (B, G, C).
        max_radius: window radius r_max in voxels (``window_radius`` of the largest scale); per-Gaussian
            radii above it are clipped to it.
        chunk_pairs: (Gaussian, window voxel) pairs processed at once; bounds peak memory.
        window: ``radius`` (each Gaussian's own window, one host sync) or ``max`` (the r_max window for
            all, masked; no sync); see the module docstring.
    """
    if window not in SPLAT_WINDOWS:
        raise ValueError(f"splat window={window!r}; valid choices: {', '.join(SPLAT_WINDOWS)}")
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
        opacity, sem = opacities.float().reshape(b * g), semantics.float().reshape(b * g, -1)
        if window == "max":
            buckets = [_Bucket(0, b * g, max_radius, clip=True)]
        else:  # sort by radius: each bucket is a contiguous run of Gaussians with one window size
            order = torch.argsort(radius)
            counts = torch.bincount(radius, minlength=max_radius + 1).tolist()  # the one host sync
            flat_means, precision, opacity, sem = flat_means[order], precision[order], opacity[order], sem[order]
            centre, radius, batch = centre[order], radius[order], batch[order]
            buckets, start = [], 0
            for r, n in enumerate(counts):
                if n:
                    buckets.append(_Bucket(start, start + n, r, clip=False))
                    start += n
        out = _SplatFunction.apply(flat_means, precision, opacity, sem, centre, radius, batch, buckets, grid, b,
                                   chunk_pairs)
    return out.view(b, grid.num_voxels, -1)
