"""QCNet's map encoder: map points -> polygons (pt2pl), then polygon self-attention (pl2pl)."""

from __future__ import annotations

from typing import Mapping

import torch
from torch import nn

from drivebench.models.qcnet.geometry import relative_pose
from drivebench.models.qcnet.layers import AttentionLayer, FourierEmbedding, init_weights
from drivebench.models.qcnet.vocab import (NUM_INTERSECTION_VALUES, NUM_PL2PL_TYPES, NUM_POINT_SIDES,
                                           NUM_POINT_TYPES, NUM_POLYGON_TYPES)


class MapEncoder(nn.Module):
    """Encode every map polygon once per scene; returns ``x_pl`` (P, hidden).

    Upstream repeats the result for each of the T history steps (it is the same map at every
    step); drivebench keeps one row per polygon and lets the agent encoder index it directly.
    """

    def __init__(self, hidden_dim: int, num_freq_bands: int, num_layers: int, num_heads: int, head_dim: int,
                 dropout: float) -> None:
        super().__init__()
        self.type_pt_emb = nn.Embedding(NUM_POINT_TYPES, hidden_dim)
        self.side_pt_emb = nn.Embedding(NUM_POINT_SIDES, hidden_dim)
        self.type_pl_emb = nn.Embedding(NUM_POLYGON_TYPES, hidden_dim)
        self.int_pl_emb = nn.Embedding(NUM_INTERSECTION_VALUES, hidden_dim)
        self.type_pl2pl_emb = nn.Embedding(NUM_PL2PL_TYPES, hidden_dim)
        self.x_pt_emb = FourierEmbedding(input_dim=1, hidden_dim=hidden_dim, num_freq_bands=num_freq_bands)
        self.x_pl_emb = FourierEmbedding(input_dim=0, hidden_dim=hidden_dim, num_freq_bands=num_freq_bands)
        self.r_pt2pl_emb = FourierEmbedding(input_dim=3, hidden_dim=hidden_dim, num_freq_bands=num_freq_bands)
        self.r_pl2pl_emb = FourierEmbedding(input_dim=3, hidden_dim=hidden_dim, num_freq_bands=num_freq_bands)
        layer = dict(hidden_dim=hidden_dim, num_heads=num_heads, head_dim=head_dim, dropout=dropout, has_pos_emb=True)
        self.pt2pl_layers = nn.ModuleList([AttentionLayer(bipartite=True, **layer) for _ in range(num_layers)])
        self.pl2pl_layers = nn.ModuleList([AttentionLayer(bipartite=False, **layer) for _ in range(num_layers)])
        self.apply(init_weights)

    def forward(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        pos_pt, orient_pt = batch["point_position"], batch["point_orientation"]
        pos_pl, orient_pl = batch["polygon_position"], batch["polygon_orientation"]

        x_pt = self.x_pt_emb(
            batch["point_magnitude"].unsqueeze(-1),
            self.type_pt_emb(batch["point_type"]) + self.side_pt_emb(batch["point_side"]),
        )
        x_pl = self.x_pl_emb(
            None, self.type_pl_emb(batch["polygon_type"]) + self.int_pl_emb(batch["polygon_is_intersection"]))

        pt2pl = batch["edge_pt2pl"]
        r_pt2pl = relative_pose(pos_pt[pt2pl[0]], pos_pl[pt2pl[1]], orient_pt[pt2pl[0]], orient_pl[pt2pl[1]])
        r_pt2pl = self.r_pt2pl_emb(r_pt2pl)

        pl2pl = batch["edge_pl2pl"]
        r_pl2pl = relative_pose(pos_pl[pl2pl[0]], pos_pl[pl2pl[1]], orient_pl[pl2pl[0]], orient_pl[pl2pl[1]])
        r_pl2pl = self.r_pl2pl_emb(r_pl2pl, self.type_pl2pl_emb(batch["edge_pl2pl_type"]))

        for pt2pl_layer, pl2pl_layer in zip(self.pt2pl_layers, self.pl2pl_layers):
            x_pl = pt2pl_layer((x_pt, x_pl), r_pt2pl, pt2pl)
            x_pl = pl2pl_layer(x_pl, r_pl2pl, pl2pl)
        return x_pl
