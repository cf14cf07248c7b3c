"""Geometry-guided kernel attention (GKT, Chen et al. 2022) as used by MapTR's BEV encoder.

Each BEV query owns Z height anchors; anchor z is projected into a camera and attention head z
reads a fixed kh x kw window of integer feature-map pixels around the projection (no learned
offsets), mixing them with softmax weights predicted from the query. The upstream CUDA op
``GeometricKernelAttentionFunc`` is a clipped integer gather; its plain-torch twin upstream is
``GeometryKernelAttention.forward_kernel_multihead_attention`` (index arithmetic + gather). We do
the same gather fused with the weighted sum through ``F.embedding_bag``, so the (query, head,
kernel, channel) tensor is never materialised (it would be ~1.8 GB per sample at MapTR-tiny size).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from drivebench.models.maptr.geometry import scale_xy


def kernel_offsets(kernel_hw: tuple[int, int], dilation: int = 1) -> torch.Tensor:
    """Integer (dx, dy) offsets of the kernel, (kh * kw, 2), dx-major as upstream builds them."""
    kh, kw = kernel_hw
    dy = (torch.arange(kh) - kh // 2) * dilation
    dx = (torch.arange(kw) - kw // 2) * dilation
    grid_x, grid_y = torch.meshgrid(dx, dy, indexing="ij")
    return torch.stack([grid_x, grid_y], dim=-1).reshape(kh * kw, 2)


def kernel_sample_indices(ref_uv: torch.Tensor, feat_hw: tuple[int, int], offsets: torch.Tensor) -> torch.Tensor:
    """Flat pixel index of every kernel tap, clipped to the feature map.

    Args:
        ref_uv: (..., 2) normalised (x, y) projections, [0, 1] over the feature map.
        feat_hw: (H_f, W_f).
        offsets: (K, 2) integer (dx, dy).

    Returns:
        long (..., K): ``y * W_f + x`` after rounding and clamping (upstream's clip semantics).
    """
    h, w = feat_hw
    pix = scale_xy(ref_uv, (float(w), float(h)))[..., None, :] + offsets.to(ref_uv.dtype)  # (..., K, 2)
    pix = pix.round().long()
    x = pix[..., 0].clamp(0, w - 1)
    y = pix[..., 1].clamp(0, h - 1)
    return y * w + x


def geometry_kernel_gather(value: torch.Tensor, indices: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """out[m, q, h] = sum_k weights[m, q, h, k] * value[m, indices[m, q, h, k], h].

    Args:
        value: (M, S, heads, Dh) per-head values of M feature maps with S pixels each.
        indices: long (M, Q, heads, K) pixel indices into S.
        weights: (M, Q, heads, K).

    Returns:
        (M, Q, heads * Dh).
    """
    m, s, heads, dh = value.shape
    _, q, _, k = indices.shape
    table = value.permute(0, 2, 1, 3).reshape(m * heads * s, dh)
    base = (torch.arange(m, device=indices.device)[:, None] * heads + torch.arange(heads, device=indices.device)) * s
    flat = indices + base[:, None, :, None]  # (M, Q, heads, K)
    out = F.embedding_bag(
        flat.reshape(-1, k), table, per_sample_weights=weights.reshape(-1, k).to(table.dtype), mode="sum"
    )
    return out.view(m, q, heads * dh)


class GeometryKernelAttention(nn.Module):
    """GKT over the cameras' single-level feature maps; one head per pillar height anchor.

    Args:
        embed_dims: channel width C (divisible by ``num_heads``).
        num_heads: heads = number of z anchors per BEV query (4 upstream).
        kernel_size: (kh, kw) integer window, (3, 5) upstream.
        dilation: spacing of the window taps in pixels.
    """

    def __init__(self, embed_dims: int, num_heads: int = 4, kernel_size: tuple[int, int] = (3, 5),
                 dilation: int = 1) -> None:
        super().__init__()
        if embed_dims % num_heads:
            raise ValueError(f"GKT embed_dims={embed_dims} is not divisible by num_heads={num_heads}")
        self.embed_dims = embed_dims
        self.num_heads = num_heads
        self.register_buffer("offsets", kernel_offsets(tuple(kernel_size), dilation), persistent=False)
        self.num_taps = int(self.offsets.shape[0])
        self.attention_weights = nn.Linear(embed_dims, num_heads * self.num_taps)
        self.value_proj = nn.Linear(embed_dims, embed_dims)

    def forward(self, query: torch.Tensor, value: torch.Tensor, feat_hw: tuple[int, int],
                ref_uv: torch.Tensor) -> torch.Tensor:
        """Per-camera kernel attention.

        Args:
            query: (B, Q, C) BEV queries (they predict the kernel weights).
            value: (B, N, S, C) flattened camera features, S = H_f * W_f.
            feat_hw: (H_f, W_f).
            ref_uv: (B, N, Q, heads, 2) normalised projections of each query's z anchors.

        Returns:
            (B, N, Q, C): what every camera contributes to every query (masking is the caller's).
        """
        b, n, s, c = value.shape
        q = query.shape[1]
        heads, taps = self.num_heads, self.num_taps
        if ref_uv.shape != (b, n, q, heads, 2):
            raise ValueError(f"GKT ref_uv has shape {tuple(ref_uv.shape)}, expected {(b, n, q, heads, 2)} "
                             "(one projected anchor per head: num_points_in_pillar must equal the GKT heads)")
        weights = self.attention_weights(query).view(b, 1, q, heads, taps).softmax(-1)
        weights = weights.expand(b, n, q, heads, taps).reshape(b * n, q, heads, taps)
        v = self.value_proj(value).view(b * n, s, heads, c // heads)
        with torch.no_grad():
            idx = kernel_sample_indices(ref_uv.reshape(b * n, q, heads, 2), feat_hw, self.offsets)
        return geometry_kernel_gather(v, idx, weights).view(b, n, q, c)


class GeometrySpatialCrossAttention(nn.Module):
    """BEV <- cameras: GKT in every camera, averaged over the cameras that see the query.

    A camera counts for a query when at least one of its z anchors projects inside the image, as
    upstream's ``bev_mask``; upstream gathers those queries per camera with ``nonzero`` (a host
    sync and a ragged rebatch), here every camera processes every query and a mask removes the
    rest, which keeps the step free of syncs and has the same result. Upstream also takes the
    per-camera query selection from the first sample of the batch only; we use each sample's own.
    """

    def __init__(self, embed_dims: int, num_heads: int = 4, kernel_size: tuple[int, int] = (3, 5),
                 dropout: float = 0.1) -> None:
        super().__init__()
        self.attention = GeometryKernelAttention(embed_dims, num_heads, kernel_size)
        self.output_proj = nn.Linear(embed_dims, embed_dims)
        self.dropout = nn.Dropout(dropout)

    def init_weights(self) -> None:
        """Upstream's effective init: Xavier matrices (the transformer-wide Xavier pass runs after the
        GKT's own zero init), zero biases."""
        for lin in (self.attention.attention_weights, self.attention.value_proj, self.output_proj):
            nn.init.xavier_uniform_(lin.weight)
            nn.init.zeros_(lin.bias)

    def forward(self, query: torch.Tensor, value: torch.Tensor, feat_hw: tuple[int, int], ref_uv: torch.Tensor,
                visible: torch.Tensor) -> torch.Tensor:
        """query (B, Q, C); value (B, N, S, C); ref_uv (B, N, Q, Z, 2); visible bool (B, N, Q, Z)."""
        per_cam = self.attention(query, value, feat_hw, ref_uv)  # (B, N, Q, C)
        seen = visible.any(-1).to(per_cam.dtype)  # (B, N, Q)
        slots = (per_cam * seen[..., None]).sum(1)
        count = seen.sum(1).clamp(min=1.0)
        out = self.output_proj(slots / count[..., None])
        return self.dropout(out) + query
