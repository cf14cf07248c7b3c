"""Deformable feature aggregation over cameras, levels and keypoints (Sparse4D / SparseDrive /
GaussianFormer), plain PyTorch.

Replaces the ``DeformableAggregationFunction`` CUDA op: every query has P keypoints projected into
every camera; features are bilinearly sampled at each (camera, level, keypoint) and summed with
weights that are normalised jointly over (keypoint, camera, level), per channel group.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def masked_point_softmax(logits: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
    """Softmax over (P, N_cam, L) per group, with invisible projections excluded.

    Args:
        logits: (B, Q, P, N_cam, L, G).
        valid: optional bool (B, Q, P, N_cam) (or broadcastable): False where a keypoint falls
            behind a camera or outside its image. A query with no valid projection gets all-zero
            weights (not NaN), so it aggregates nothing.
    """
    b, q, p, n, lv, g = logits.shape
    flat = logits.permute(0, 1, 5, 2, 3, 4).reshape(b, q, g, p * n * lv)
    if valid is not None:
        mask = valid[..., None].expand(b, q, p, n, lv).reshape(b, q, 1, p * n * lv)
        flat = flat.masked_fill(~mask, float("-inf"))
        weights = torch.softmax(flat, dim=-1)
        weights = torch.nan_to_num(weights, nan=0.0)
    else:
        weights = torch.softmax(flat, dim=-1)
    return weights.reshape(b, q, g, p, n, lv).permute(0, 1, 3, 4, 5, 2)


def deformable_aggregation(
    features: list[torch.Tensor],
    points: torch.Tensor,
    weights: torch.Tensor,
) -> torch.Tensor:
    """Aggregate multi-camera, multi-level features at projected keypoints.

    Args:
        features: per level, (B, N_cam, C, H_l, W_l).
        points: (B, Q, P, N_cam, 2), (x, y) normalised to [0, 1] of the image (same for all levels).
        weights: (B, Q, P, N_cam, L, G), normalised (see ``masked_point_softmax``); C % G == 0.

    Returns:
        (B, Q, C).
    """
    b, q, p, n, _ = points.shape
    n_levels, groups = weights.shape[-2], weights.shape[-1]
    if len(features) != n_levels:
        raise ValueError(f"{len(features)} feature levels for weights over {n_levels} levels")
    c = features[0].shape[2]
    if c % groups:
        raise ValueError(f"channels {c} not divisible by {groups} groups")
    # grid for grid_sample: (B*N, Q, P, 2) in [-1, 1]
    grid = (2.0 * points - 1.0).permute(0, 3, 1, 2, 4).reshape(b * n, q, p, 2)
    out = None
    for lvl, feat in enumerate(features):
        fb, fn, fc, fh, fw = feat.shape
        sampled = F.grid_sample(
            feat.reshape(fb * fn, fc, fh, fw), grid.to(feat.dtype), mode="bilinear", padding_mode="zeros",
            align_corners=False,
        )  # (B*N, C, Q, P)
        sampled = sampled.view(b, n, groups, c // groups, q, p)
        w = weights[..., lvl, :].to(sampled.dtype)  # (B, Q, P, N, G)
        contrib = torch.einsum("bngcqp,bqpng->bqgc", sampled, w)
        out = contrib if out is None else out + contrib
    assert out is not None
    return out.reshape(b, q, c)
