"""Deformable attention blocks on the BEV plane (BEVFormer's temporal self-attention and the
decoder's single-level deformable cross-attention) plus the transformer FFN.

Both sample the BEV with ``drivebench.models.ops.multi_scale_deformable_attn`` (the plain-torch
replacement of mmcv's CUDA op) and are initialised as upstream: zero offset weights with a
"ring" bias, zero attention weights, Xavier value/output projections.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from drivebench.models.maptr.geometry import scale_xy
from drivebench.models.ops import multi_scale_deformable_attn


def _ring_offset_bias(num_heads: int, num_groups: int, num_points: int) -> torch.Tensor:
    """Deformable-DETR's offset init: head h points along angle 2*pi*h/heads, point p at distance p+1."""
    thetas = torch.arange(num_heads, dtype=torch.float32) * (2.0 * math.pi / num_heads)
    grid = torch.stack([thetas.cos(), thetas.sin()], -1)
    grid = grid / grid.abs().max(-1, keepdim=True)[0]
    grid = grid.view(num_heads, 1, 1, 2).repeat(1, num_groups, num_points, 1)
    grid = grid * torch.arange(1, num_points + 1, dtype=torch.float32).view(1, 1, num_points, 1)
    return grid.reshape(-1)


def _init_as_upstream(attn: nn.Module, num_groups: int) -> None:
    """Both blocks' init: zero offset weights with the ring bias, zero attention weights, Xavier projections."""
    nn.init.zeros_(attn.sampling_offsets.weight)
    with torch.no_grad():
        attn.sampling_offsets.bias.copy_(_ring_offset_bias(attn.num_heads, num_groups, attn.num_points))
    nn.init.zeros_(attn.attention_weights.weight)
    nn.init.zeros_(attn.attention_weights.bias)
    for lin in (attn.value_proj, attn.output_proj):
        nn.init.xavier_uniform_(lin.weight)
        nn.init.zeros_(lin.bias)


class FFN(nn.Module):
    """Linear-ReLU-Dropout-Linear-Dropout with a residual (mmcv's FFN)."""

    def __init__(self, embed_dims: int, hidden_dims: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(embed_dims, hidden_dims), nn.ReLU(inplace=True), nn.Dropout(dropout),
            nn.Linear(hidden_dims, embed_dims), nn.Dropout(dropout),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.layers(x)


class TemporalSelfAttention(nn.Module):
    """BEVFormer TSA: each BEV query samples a queue of two BEVs, [previous, current].

    Offsets and weights are predicted from ``cat(previous BEV, query + pos)``; the queue outputs are
    averaged. Without a previous BEV the caller passes the current queries as ``prev_bev`` (upstream
    stacks the current queries twice). Upstream takes the "previous" half of that concatenation from
    ``value[:bs]`` of the interleaved (bs*2) stack, which mixes samples when bs > 1; we pair every
    sample with its own previous BEV.
    """

    def __init__(self, embed_dims: int, num_heads: int = 8, num_points: int = 4, num_bev_queue: int = 2,
                 dropout: float = 0.1) -> None:
        super().__init__()
        if embed_dims % num_heads:
            raise ValueError(f"TSA embed_dims={embed_dims} is not divisible by num_heads={num_heads}")
        if num_bev_queue != 2:
            raise ValueError(f"TSA supports num_bev_queue=2 (previous + current BEV), got {num_bev_queue}")
        self.embed_dims, self.num_heads = embed_dims, num_heads
        self.num_points, self.num_bev_queue = num_points, num_bev_queue
        self.sampling_offsets = nn.Linear(embed_dims * num_bev_queue, num_bev_queue * num_heads * num_points * 2)
        self.attention_weights = nn.Linear(embed_dims * num_bev_queue, num_bev_queue * num_heads * num_points)
        self.value_proj = nn.Linear(embed_dims, embed_dims)
        self.output_proj = nn.Linear(embed_dims, embed_dims)
        self.dropout = nn.Dropout(dropout)

    def init_weights(self) -> None:
        _init_as_upstream(self, self.num_bev_queue)

    def forward(self, query: torch.Tensor, query_pos: torch.Tensor, prev_bev: torch.Tensor,
                ref_2d: torch.Tensor, bev_hw: tuple[int, int]) -> torch.Tensor:
        """
        Args:
            query: (B, Q, C) current BEV queries (also the residual).
            query_pos: (Q, C) or (B, Q, C) BEV positional encoding.
            prev_bev: (B, Q, C) previous BEV aligned to the current frame, or the queries themselves.
            ref_2d: (B, 2, Q, 2) normalised reference points for [previous (ego-motion shifted), current].
            bev_hw: (bev_h, bev_w).
        """
        b, q, c = query.shape
        heads, pts, queue = self.num_heads, self.num_points, self.num_bev_queue
        value = torch.stack([prev_bev, query], dim=1).reshape(b * queue, q, c)
        mixed = torch.cat([prev_bev, query + query_pos], dim=-1)
        offsets = self.sampling_offsets(mixed).view(b, q, heads, queue, 1, pts, 2)
        weights = self.attention_weights(mixed).view(b, q, heads, queue, pts).softmax(-1)
        offsets = offsets.permute(0, 3, 1, 2, 4, 5, 6).reshape(b * queue, q, heads, 1, pts, 2)
        weights = weights.permute(0, 3, 1, 2, 4).reshape(b * queue, q, heads, 1, pts)
        locations = ref_2d.reshape(b * queue, q, 1, 1, 1, 2) + scale_xy(offsets, (1.0 / bev_hw[1], 1.0 / bev_hw[0]))
        v = self.value_proj(value).view(b * queue, q, heads, c // heads)
        out = multi_scale_deformable_attn(v, [tuple(bev_hw)], locations, weights)  # (B*2, Q, C)
        out = out.view(b, queue, q, c).mean(1)
        return self.dropout(self.output_proj(out)) + query


class DeformableBEVAttention(nn.Module):
    """Decoder cross-attention: every query samples ``num_points`` BEV locations per head around its
    reference point (upstream ``CustomMSDeformableAttention`` with one level)."""

    def __init__(self, embed_dims: int, num_heads: int = 8, num_points: int = 4, dropout: float = 0.1) -> None:
        super().__init__()
        if embed_dims % num_heads:
            raise ValueError(f"deformable attention embed_dims={embed_dims} is not divisible by num_heads={num_heads}")
        self.embed_dims, self.num_heads, self.num_points = embed_dims, num_heads, num_points
        self.sampling_offsets = nn.Linear(embed_dims, num_heads * num_points * 2)
        self.attention_weights = nn.Linear(embed_dims, num_heads * num_points)
        self.value_proj = nn.Linear(embed_dims, embed_dims)
        self.output_proj = nn.Linear(embed_dims, embed_dims)
        self.dropout = nn.Dropout(dropout)

    def init_weights(self) -> None:
        _init_as_upstream(self, 1)

    def forward(self, query: torch.Tensor, query_pos: torch.Tensor, value: torch.Tensor,
                reference_points: torch.Tensor, bev_hw: tuple[int, int]) -> torch.Tensor:
        """query/query_pos (B, Q, C); value (B, S, C) BEV features; reference_points (B, Q, 2) in [0, 1]."""
        b, q, c = query.shape
        heads, pts = self.num_heads, self.num_points
        q_in = query + query_pos
        offsets = self.sampling_offsets(q_in).view(b, q, heads, 1, pts, 2)
        weights = self.attention_weights(q_in).view(b, q, heads, 1, pts).softmax(-1)
        locations = reference_points[:, :, None, None, None, :] + scale_xy(offsets, (1.0 / bev_hw[1], 1.0 / bev_hw[0]))
        v = self.value_proj(value).view(b, value.shape[1], heads, c // heads)
        out = multi_scale_deformable_attn(v, [tuple(bev_hw)], locations, weights)
        return self.dropout(self.output_proj(out)) + query
