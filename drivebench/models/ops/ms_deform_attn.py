"""Multi-scale deformable attention (Deformable DETR / BEVFormer), plain PyTorch.

Replaces mmcv's ``MultiScaleDeformableAttnFunction`` CUDA op with one ``F.grid_sample`` per level,
the same arithmetic as mmcv's own pure-PyTorch fallback, written here from the equations:
``out[q, h] = sum_{l, p} a[q, h, l, p] * V_l,h(loc[q, h, l, p])`` with bilinear sampling and zero
padding outside the map. Under autocast the locations stay float32 (``sample_bilinear``), as upstream's
BEVFormer/MapTR run the CUDA op wholly in float32.
"""

from __future__ import annotations

import torch

from drivebench.models.ops.bilinear import sample_bilinear


def multi_scale_deformable_attn(
    value: torch.Tensor,
    spatial_shapes: list[tuple[int, int]],
    sampling_locations: torch.Tensor,
    attention_weights: torch.Tensor,
) -> torch.Tensor:
    """Sample and mix per-head values at learned locations.

    Args:
        value: (B, S, H, Dh), the flattened levels concatenated along S = sum(h_l * w_l).
        spatial_shapes: (h_l, w_l) per level, in the order of ``value``'s levels.
        sampling_locations: (B, Q, H, L, P, 2), (x, y) normalised to [0, 1] of each level.
        attention_weights: (B, Q, H, L, P), already normalised over (L, P).

    Returns:
        (B, Q, H * Dh).
    """
    b, s, h, dh = value.shape
    _, q, _, n_levels, n_points, _ = sampling_locations.shape
    if len(spatial_shapes) != n_levels:
        raise ValueError(f"{len(spatial_shapes)} spatial shapes for {n_levels} sampling levels")
    if sum(hl * wl for hl, wl in spatial_shapes) != s:
        raise ValueError(f"spatial_shapes cover {sum(hl * wl for hl, wl in spatial_shapes)} positions, value has {s}")
    value_list = value.split([hl * wl for hl, wl in spatial_shapes], dim=1)
    grids = 2.0 * sampling_locations - 1.0  # at the locations' precision: upstream runs the op in float32
    sampled = []
    for lvl, (hl, wl) in enumerate(spatial_shapes):
        # (B, HlWl, H, Dh) -> (B*H, Dh, Hl, Wl)
        v = value_list[lvl].flatten(2).transpose(1, 2).reshape(b * h, dh, hl, wl)
        # (B, Q, H, P, 2) -> (B*H, Q, P, 2)
        g = grids[:, :, :, lvl].transpose(1, 2).flatten(0, 1)
        sampled.append(sample_bilinear(v, g))
    # (B*H, Dh, Q, L, P)
    stacked = torch.stack(sampled, dim=-2)
    w = attention_weights.transpose(1, 2).reshape(b * h, 1, q, n_levels, n_points).to(stacked.dtype)
    out = (stacked * w).sum(dim=(-1, -2)).view(b, h * dh, q)
    return out.transpose(1, 2).contiguous()
