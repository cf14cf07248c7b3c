"""Occupancy head: splat the Gaussians of an encoder layer onto the voxel grid (upstream GaussianHead)."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from drivebench.models.gaussianformer.geometry import GaussianSet, GridSpec
from drivebench.models.gaussianformer.splat import DEFAULT_CHUNK_PAIRS, SPLAT_WINDOWS, splat_gaussians, window_radius


class GaussianOccupancyHead(nn.Module):
    """Per-voxel class scores (B, C, X, Y, Z) from one layer's Gaussians.

    Two upstream variants of the empty class:
    * ``with_empty=False`` (gs144000): the Gaussians carry all C semantics (empty included) and
      opacity 1 when the config has none.
    * ``with_empty=True`` (gs25600 solid): the Gaussians carry C-1 semantics (the empty channel is 0
      for them) and one extra fixed, axis-aligned "empty" Gaussian (mean ``empty_mean``, scales
      ``empty_scale``, opacity 1) adds ``empty_scalar`` (learnable, init 10) to the empty channel.
      Upstream splats it like the others; its window covers the whole grid, so here its density
      is a precomputed per-voxel buffer, which is the same sum.

    ``window``: ``radius`` (each Gaussian's own window, upstream's work) or ``max`` (the largest window
    for every Gaussian, masked: more work, no host sync); see ``splat``.
    """

    def __init__(
        self,
        grid: GridSpec,
        num_classes: int,
        empty_label: int,
        max_scale: float,
        with_empty: bool = False,
        empty_mean: Sequence[float] = (0.0, 0.0, -1.0),
        empty_scale: Sequence[float] = (100.0, 100.0, 8.0),
        scale_multiplier: float = 3.0,
        chunk_pairs: int = DEFAULT_CHUNK_PAIRS,
        window: str = "radius",
    ) -> None:
        super().__init__()
        if not 0 <= empty_label < num_classes:
            raise ValueError(f"empty_label={empty_label} must lie in [0, num_classes={num_classes})")
        self.grid = grid
        self.num_classes = num_classes
        self.empty_label = empty_label
        self.with_empty = with_empty
        self.scale_multiplier = scale_multiplier
        self.max_radius = window_radius(max_scale, grid.voxel_size, scale_multiplier)
        self.chunk_pairs = chunk_pairs
        if window not in SPLAT_WINDOWS:
            raise ValueError(f"splat_window={window!r}; valid choices: {', '.join(SPLAT_WINDOWS)}")
        self.window = window
        centres = grid.voxel_centers()
        self.register_buffer("voxel_centers", centres, persistent=False)
        if with_empty:
            self.empty_scalar = nn.Parameter(torch.tensor(10.0))
            z = (centres - torch.tensor(empty_mean)) / torch.tensor(empty_scale)
            self.register_buffer("empty_density", torch.exp(-0.5 * z.square().sum(-1)).reshape(-1), persistent=False)
            self.register_buffer("empty_onehot", torch.eye(num_classes)[empty_label], persistent=False)

    @property
    def gaussian_classes(self) -> int:
        """Semantic channels the Gaussians must carry."""
        return self.num_classes - int(self.with_empty)

    def forward(self, gaussians: GaussianSet) -> torch.Tensor:
        sem = gaussians.semantics
        if sem.shape[-1] != self.gaussian_classes:
            raise ValueError(f"Gaussians carry {sem.shape[-1]} semantic channels; this head (with_empty="
                             f"{self.with_empty}, num_classes={self.num_classes}) needs {self.gaussian_classes}")
        opacity = gaussians.opacities[..., 0] if gaussians.opacities.shape[-1] else torch.ones_like(sem[..., 0])
        if self.with_empty:
            zero = torch.zeros_like(sem[..., :1])
            sem = torch.cat([sem[..., :self.empty_label], zero, sem[..., self.empty_label:]], dim=-1)
        out = splat_gaussians(gaussians.means, gaussians.scales, gaussians.rotations, opacity, sem, self.grid,
                              self.max_radius, self.scale_multiplier, self.chunk_pairs, self.window)
        if self.with_empty:
            out = out + (self.empty_scalar * self.empty_density).unsqueeze(-1) * self.empty_onehot
        b = out.shape[0]
        return out.view(b, *self.grid.shape, self.num_classes).permute(0, 4, 1, 2, 3)
