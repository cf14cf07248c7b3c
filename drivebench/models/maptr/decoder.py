"""MapTR's decoder: hierarchical instance/point queries refined layer by layer over the BEV.

Every layer is (upstream ``DetrTransformerDecoderLayer``, post-norm): self-attention over all
``num_vec * num_pts`` queries, deformable cross-attention into the BEV around each query's
reference point, FFN. After every layer the regression branch moves the reference points
(inverse-sigmoid refinement, upstream ``with_box_refine``); the refined points are that layer's
prediction and, detached, the next layer's reference points.
"""

from __future__ import annotations

import copy
import math

import torch
from torch import nn

from drivebench.models.maptr.attention import FFN, DeformableBEVAttention
from drivebench.models.maptr.geometry import inverse_sigmoid


class MapDecoderLayer(nn.Module):
    """MHSA -> norm -> deformable BEV attention -> norm -> FFN -> norm."""

    def __init__(self, embed_dims: int, num_heads: int, ffn_dims: int, num_points: int = 4,
                 dropout: float = 0.1, deform_heads: int = 8) -> None:
        super().__init__()
        self.self_attn = nn.MultiheadAttention(embed_dims, num_heads, dropout=dropout, batch_first=True)
        self.self_attn_drop = nn.Dropout(dropout)
        self.norm1 = nn.LayerNorm(embed_dims)
        self.cross_attn = DeformableBEVAttention(embed_dims, deform_heads, num_points, dropout)
        self.norm2 = nn.LayerNorm(embed_dims)
        self.ffn = FFN(embed_dims, ffn_dims, dropout)
        self.norm3 = nn.LayerNorm(embed_dims)

    def forward(self, query: torch.Tensor, query_pos: torch.Tensor, bev: torch.Tensor,
                reference_points: torch.Tensor, bev_hw: tuple[int, int]) -> torch.Tensor:
        qk = query + query_pos
        attn, _ = self.self_attn(qk, qk, query, need_weights=False)
        x = self.norm1(query + self.self_attn_drop(attn))
        x = self.norm2(self.cross_attn(x, query_pos, bev, reference_points, bev_hw))
        return self.norm3(self.ffn(x))


def _classification_branch(embed_dims: int, num_classes: int, num_fcs: int = 2) -> nn.Sequential:
    layers: list[nn.Module] = []
    for _ in range(num_fcs):
        layers += [nn.Linear(embed_dims, embed_dims), nn.LayerNorm(embed_dims), nn.ReLU(inplace=True)]
    layers.append(nn.Linear(embed_dims, num_classes))
    return nn.Sequential(*layers)


def _regression_branch(embed_dims: int, out_dims: int = 2, num_fcs: int = 2) -> nn.Sequential:
    layers: list[nn.Module] = []
    for _ in range(num_fcs):
        layers += [nn.Linear(embed_dims, embed_dims), nn.ReLU()]
    layers.append(nn.Linear(embed_dims, out_dims))
    return nn.Sequential(*layers)


class MapDecoder(nn.Module):
    """Queries -> per-layer class logits and normalised points.

    Args:
        embed_dims: C.
        num_layers: decoder layers (each with its own classification and regression branch).
        num_heads: self-attention heads; deform_heads: heads of the deformable BEV attention
            (upstream nano sets 4 for the former and keeps the default 8 for the latter).
        num_vec: instance queries; num_pts: point queries per instance.
        num_classes: map classes (sigmoid, no background logit).
    """

    def __init__(self, embed_dims: int, num_layers: int, num_heads: int, ffn_dims: int, num_vec: int,
                 num_pts: int, num_classes: int, num_points: int = 4, dropout: float = 0.1,
                 deform_heads: int = 8) -> None:
        super().__init__()
        self.embed_dims, self.num_vec, self.num_pts = embed_dims, num_vec, num_pts
        self.instance_embedding = nn.Embedding(num_vec, embed_dims * 2)
        self.pts_embedding = nn.Embedding(num_pts, embed_dims * 2)
        self.reference_points = nn.Linear(embed_dims, 2)
        self.layers = nn.ModuleList([
            MapDecoderLayer(embed_dims, num_heads, ffn_dims, num_points, dropout, deform_heads)
            for _ in range(num_layers)
        ])
        cls_branch = _classification_branch(embed_dims, num_classes)
        reg_branch = _regression_branch(embed_dims)
        self.cls_branches = nn.ModuleList([copy.deepcopy(cls_branch) for _ in range(num_layers)])
        self.reg_branches = nn.ModuleList([copy.deepcopy(reg_branch) for _ in range(num_layers)])

    def init_weights(self, prior_prob: float = 0.01) -> None:
        """Xavier on the transformer's matrices, attention-specific inits, focal prior on class bias."""
        for module in (self.layers, self.reference_points):
            for p in module.parameters():
                if p.dim() > 1:
                    nn.init.xavier_uniform_(p)
        nn.init.zeros_(self.reference_points.bias)
        for layer in self.layers:
            layer.cross_attn.init_weights()
        bias = -math.log((1 - prior_prob) / prior_prob)
        for branch in self.cls_branches:
            nn.init.constant_(branch[-1].bias, bias)

    def forward(self, bev: torch.Tensor, bev_hw: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        """
        Args:
            bev: (B, bev_h * bev_w, C) BEV features.

        Returns:
            cls_logits: (L, B, num_vec, num_classes), one set per decoder layer.
            pts_norm: (L, B, num_vec, num_pts, 2), normalised (x, y) in [0, 1].
        """
        b = bev.shape[0]
        v, p, c = self.num_vec, self.num_pts, self.embed_dims
        embeds = (self.pts_embedding.weight[None, :, :] + self.instance_embedding.weight[:, None, :]).flatten(0, 1)
        embeds = embeds.to(bev.dtype)
        query_pos, query = embeds.split(c, dim=-1)
        query_pos = query_pos[None].expand(b, -1, -1)
        x = query[None].expand(b, -1, -1)
        reference = self.reference_points(query_pos).sigmoid()  # (B, V*P, 2), not detached (upstream)
        all_cls, all_pts = [], []
        for layer, cls_branch, reg_branch in zip(self.layers, self.cls_branches, self.reg_branches):
            x = layer(x, query_pos, bev, reference, bev_hw)
            all_cls.append(cls_branch(x.view(b, v, p, c).mean(2)))
            pts = (reg_branch(x) + inverse_sigmoid(reference)).sigmoid()
            all_pts.append(pts.view(b, v, p, 2))
            reference = pts.detach()
        return torch.stack(all_cls), torch.stack(all_pts)
