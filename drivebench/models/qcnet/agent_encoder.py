"""QCNet's agent encoder: per layer, temporal attention, map-to-agent and agent-to-agent attention."""

from __future__ import annotations

from typing import Mapping

import torch
from torch import nn

from drivebench.models.qcnet.geometry import angle_between_2d_vectors, relative_pose
from drivebench.models.qcnet.layers import AttentionLayer, FourierEmbedding, init_weights
from drivebench.models.qcnet.vocab import NUM_AGENT_TYPES


class AgentEncoder(nn.Module):
    """Encode each agent at each history step; returns ``x_a`` (A * T, hidden), row ``a * T + t``.

    Upstream transposes between agent-major (temporal attention) and step-major (spatial
    attention) layouts every layer. Because the CPU batch builder numbers agent-steps ``a * T + t``
    in every graph, one agent-major layout serves all three attentions with no transposes.
    """

    def __init__(self, hidden_dim: int, num_historical_steps: int, num_freq_bands: int, num_layers: int,
                 num_heads: int, head_dim: int, dropout: float) -> None:
        super().__init__()
        self.hidden_dim = hidden_dim
        self.num_historical_steps = num_historical_steps
        self.type_a_emb = nn.Embedding(NUM_AGENT_TYPES, hidden_dim)
        self.x_a_emb = FourierEmbedding(input_dim=4, hidden_dim=hidden_dim, num_freq_bands=num_freq_bands)
        self.r_t_emb = FourierEmbedding(input_dim=4, hidden_dim=hidden_dim, num_freq_bands=num_freq_bands)
        self.r_pl2a_emb = FourierEmbedding(input_dim=3, hidden_dim=hidden_dim, num_freq_bands=num_freq_bands)
        self.r_a2a_emb = FourierEmbedding(input_dim=3, hidden_dim=hidden_dim, num_freq_bands=num_freq_bands)
        layer = dict(hidden_dim=hidden_dim, num_heads=num_heads, head_dim=head_dim, dropout=dropout, has_pos_emb=True)
        self.t_attn_layers = nn.ModuleList([AttentionLayer(bipartite=False, **layer) for _ in range(num_layers)])
        self.pl2a_attn_layers = nn.ModuleList([AttentionLayer(bipartite=True, **layer) for _ in range(num_layers)])
        self.a2a_attn_layers = nn.ModuleList([AttentionLayer(bipartite=False, **layer) for _ in range(num_layers)])
        self.apply(init_weights)

    def forward(self, batch: Mapping[str, torch.Tensor], x_pl: torch.Tensor) -> torch.Tensor:
        pos = batch["agent_position"]  # (A, T, 2)
        if pos.size(1) != self.num_historical_steps:
            raise ValueError(f"agent_position has {pos.size(1)} steps; this QCNet was built for "
                             f"num_historical_steps={self.num_historical_steps}")
        head = batch["agent_heading"]
        vel = batch["agent_velocity"]
        head_vec = torch.stack([head.cos(), head.sin()], dim=-1)
        motion = torch.cat([torch.zeros_like(pos[:, :1]), pos[:, 1:] - pos[:, :-1]], dim=1)
        x_a = torch.stack(
            [
                torch.linalg.vector_norm(motion, dim=-1),
                angle_between_2d_vectors(head_vec, motion),
                torch.linalg.vector_norm(vel, dim=-1),
                angle_between_2d_vectors(head_vec, vel),
            ],
            dim=-1,
        )
        x_a = self.x_a_emb(x_a, self.type_a_emb(batch["agent_type"]).unsqueeze(1))  # (A, T, H)
        x_a = x_a.reshape(-1, self.hidden_dim)

        pos_s, head_s = pos.reshape(-1, 2), head.reshape(-1)
        pos_pl, orient_pl = batch["polygon_position"], batch["polygon_orientation"]

        edge_t = batch["edge_t"]
        r_t = relative_pose(pos_s[edge_t[0]], pos_s[edge_t[1]], head_s[edge_t[0]], head_s[edge_t[1]])
        r_t = torch.cat([r_t, (edge_t[0] - edge_t[1]).to(r_t.dtype).unsqueeze(-1)], dim=-1)
        r_t = self.r_t_emb(r_t)

        edge_pl2a = batch["edge_pl2a"]
        r_pl2a = relative_pose(pos_pl[edge_pl2a[0]], pos_s[edge_pl2a[1]], orient_pl[edge_pl2a[0]], head_s[edge_pl2a[1]])
        r_pl2a = self.r_pl2a_emb(r_pl2a)

        edge_a2a = batch["edge_a2a"]
        r_a2a = relative_pose(pos_s[edge_a2a[0]], pos_s[edge_a2a[1]], head_s[edge_a2a[0]], head_s[edge_a2a[1]])
        r_a2a = self.r_a2a_emb(r_a2a)

        for t_layer, pl2a_layer, a2a_layer in zip(self.t_attn_layers, self.pl2a_attn_layers, self.a2a_attn_layers):
            x_a = t_layer(x_a, r_t, edge_t)
            x_a = pl2a_layer((x_pl, x_a), r_pl2a, edge_pl2a)
            x_a = a2a_layer(x_a, r_a2a, edge_a2a)
        return x_a
