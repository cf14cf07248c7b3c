"""Bilinear sampling at full-precision locations, for the deformable ops under autocast."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def sample_bilinear(source: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
    """``F.grid_sample`` (bilinear, zero padding, ``align_corners=False``) with the grid kept in float32 (float64
    stays), whatever the source's dtype; the samples come back in the source's dtype.

    ``grid_sample`` takes one dtype for both, and a bf16 grid moves each location by up to 1/512 of the map
    (0.17 px at 176 columns; 1.5% rms of SparseDrive's aggregation output on smooth maps, 15x the features' own
    rounding: ``scripts/aggregation_precision.py``). Upstream's CUDA ops take float32 locations, so a bf16 source
    is sampled in float32 (a float32 copy of it kept for backward) and the samples cast back.
    """
    grid = grid.to(torch.promote_types(grid.dtype, torch.float32))
    wide = source.to(torch.promote_types(source.dtype, grid.dtype))
    return F.grid_sample(wide, grid, mode="bilinear", padding_mode="zeros", align_corners=False).to(source.dtype)
