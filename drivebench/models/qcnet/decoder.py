"""QCNet's decoder: K mode queries attend to history, map and neighbours; propose, then refine."""

from __future__ import annotations

from typing import Mapping

import torch
import torch.nn.functional as F
from torch import nn

from drivebench.models.qcnet.geometry import relative_pose
from drivebench.models.qcnet.layers import AttentionLayer, FourierEmbedding, MLPLayer, TrajectoryGRU, init_weights


class Decoder(nn.Module):
    """Proposal stage (``num_recurrent_steps`` chunks of the future, cumulative Laplace outputs), a GRU
    embedding of each proposal, and a refinement stage predicting offsets, scales and mode logits.

    Mode queries are numbered ``a * K + k`` throughout (upstream switches to mode-major for the
    map/agent attentions; the edge sets are the same up to that renumbering). Upstream copies each
    t2m/pl2m/a2m edge to the K mode queries of its agent; here the edges stay per agent and the
    attention layers treat the K queries as a group (``group_size=K``), which is the same math.
    Outputs: ``loc_propose_pos`` / ``scale_propose_pos`` / ``loc_refine_pos`` / ``scale_refine_pos``
    (A, K, F, 2) in each agent's frame at the last history step, and ``pi`` (A, K) mode logits.
    """

    def __init__(self, hidden_dim: int, output_dim: int, num_historical_steps: int, num_future_steps: int,
                 num_modes: int, num_recurrent_steps: int, num_freq_bands: int, num_layers: int, num_heads: int,
                 head_dim: int, dropout: float, output_heads_fp32: bool = True) -> None:
        super().__init__()
        if num_future_steps % num_recurrent_steps:
            raise ValueError(f"num_future_steps={num_future_steps} must be divisible by "
                             f"num_recurrent_steps={num_recurrent_steps}")
        self.hidden_dim = hidden_dim
        self.output_dim = output_dim
        self.num_historical_steps = num_historical_steps
        self.num_future_steps = num_future_steps
        self.num_modes = num_modes
        self.num_recurrent_steps = num_recurrent_steps
        self.output_heads_fp32 = output_heads_fp32

        self.mode_emb = nn.Embedding(num_modes, hidden_dim)
        self.r_t2m_emb = FourierEmbedding(input_dim=4, hidden_dim=hidden_dim, num_freq_bands=num_freq_bands)
        self.r_pl2m_emb = FourierEmbedding(input_dim=3, hidden_dim=hidden_dim, num_freq_bands=num_freq_bands)
        self.r_a2m_emb = FourierEmbedding(input_dim=3, hidden_dim=hidden_dim, num_freq_bands=num_freq_bands)
        self.y_emb = FourierEmbedding(input_dim=output_dim, hidden_dim=hidden_dim, num_freq_bands=num_freq_bands)
        self.traj_emb = TrajectoryGRU(hidden_dim, hidden_dim)
        self.traj_emb_h0 = nn.Parameter(torch.zeros(1, hidden_dim))

        def cross_layers() -> nn.ModuleList:
            return nn.ModuleList([
                AttentionLayer(hidden_dim=hidden_dim, num_heads=num_heads, head_dim=head_dim, dropout=dropout,
                               bipartite=True, has_pos_emb=True)
                for _ in range(num_layers)
            ])

        def mode_layer() -> AttentionLayer:
            return AttentionLayer(hidden_dim=hidden_dim, num_heads=num_heads, head_dim=head_dim, dropout=dropout,
                                  bipartite=False, has_pos_emb=False)

        self.t2m_propose_attn_layers = cross_layers()
        self.pl2m_propose_attn_layers = cross_layers()
        self.a2m_propose_attn_layers = cross_layers()
        self.m2m_propose_attn_layer = mode_layer()
        self.t2m_refine_attn_layers = cross_layers()
        self.pl2m_refine_attn_layers = cross_layers()
        self.a2m_refine_attn_layers = cross_layers()
        self.m2m_refine_attn_layer = mode_layer()
        chunk = num_future_steps * output_dim // num_recurrent_steps
        self.to_loc_propose_pos = MLPLayer(hidden_dim, hidden_dim, chunk)
        self.to_scale_propose_pos = MLPLayer(hidden_dim, hidden_dim, chunk)
        self.to_loc_refine_pos = MLPLayer(hidden_dim, hidden_dim, num_future_steps * output_dim)
        self.to_scale_refine_pos = MLPLayer(hidden_dim, hidden_dim, num_future_steps * output_dim)
        self.to_pi = MLPLayer(hidden_dim, hidden_dim, 1)
        self.apply(init_weights)

    def _head(self, head: nn.Module, m: torch.Tensor) -> torch.Tensor:
        """An output head, in float32 under any autocast when ``output_heads_fp32``. Why: under ``bf16-mixed`` the
        heads' last matmul rounds the predicted offsets, scales and mode logits to bf16 (8 bits of mantissa: 3 cm
        steps on a 5 m offset) before the loss; the heads are small next to the attention layers."""
        if not self.output_heads_fp32:
            return head(m)
        with torch.autocast(m.device.type, enabled=False):
            return head(m.float())

    def forward(self, batch: Mapping[str, torch.Tensor], x_pl: torch.Tensor,
                x_a: torch.Tensor) -> dict[str, torch.Tensor]:
        K, T, H = self.num_modes, self.num_historical_steps, self.hidden_dim
        pos = batch["agent_position"]
        head = batch["agent_heading"]
        num_agents = pos.size(0)
        pos_m, head_m = pos[:, -1], head[:, -1]
        pos_t, head_t = pos.reshape(-1, 2), head.reshape(-1)
        x_t = x_a  # (A*T, H): every history step is a key for t2m
        x_now = x_a.view(num_agents, T, H)[:, -1]  # (A, H)

        edge_t2m = batch["edge_t2m"]
        r_t2m = relative_pose(pos_t[edge_t2m[0]], pos_m[edge_t2m[1]], head_t[edge_t2m[0]], head_m[edge_t2m[1]])
        step = (edge_t2m[0] % T - T + 1).to(r_t2m.dtype)
        r_t2m = self.r_t2m_emb(torch.cat([r_t2m, step.unsqueeze(-1)], dim=-1))

        pos_pl, orient_pl = batch["polygon_position"], batch["polygon_orientation"]
        edge_pl2m = batch["edge_pl2m"]
        r_pl2m = relative_pose(pos_pl[edge_pl2m[0]], pos_m[edge_pl2m[1]], orient_pl[edge_pl2m[0]], head_m[edge_pl2m[1]])
        r_pl2m = self.r_pl2m_emb(r_pl2m)

        edge_a2m = batch["edge_a2m"]
        r_a2m = relative_pose(pos_m[edge_a2m[0]], pos_m[edge_a2m[1]], head_m[edge_a2m[0]], head_m[edge_a2m[1]])
        r_a2m = self.r_a2m_emb(r_a2m)

        edge_m2m = batch["edge_m2m"]

        def attend(m: torch.Tensor, t2m: nn.ModuleList, pl2m: nn.ModuleList, a2m: nn.ModuleList,
                   m2m: AttentionLayer) -> torch.Tensor:
            for t2m_layer, pl2m_layer, a2m_layer in zip(t2m, pl2m, a2m):
                m = t2m_layer((x_t, m), r_t2m, edge_t2m, group_size=K)
                m = pl2m_layer((x_pl, m), r_pl2m, edge_pl2m, group_size=K)
                m = a2m_layer((x_now, m), r_a2m, edge_a2m, group_size=K)
            return m2m(m, None, edge_m2m)

        m = self.mode_emb.weight.repeat(num_agents, 1)  # (A*K, H), row a*K + k
        locs, scales = [], []
        for _ in range(self.num_recurrent_steps):
            m = attend(m, self.t2m_propose_attn_layers, self.pl2m_propose_attn_layers,
                       self.a2m_propose_attn_layers, self.m2m_propose_attn_layer)
            locs.append(self._head(self.to_loc_propose_pos, m))
            scales.append(self._head(self.to_scale_propose_pos, m))
        shape = (num_agents, K, self.num_future_steps, self.output_dim)
        loc_propose = torch.cumsum(torch.cat(locs, dim=-1).view(shape), dim=-2)
        scale_propose = torch.cumsum(F.elu(torch.cat(scales, dim=-1).view(shape)) + 1.0, dim=-2) + 0.1

        m = self.y_emb(loc_propose.detach().reshape(-1, self.output_dim))  # (A*K*F, H)
        m = m.view(num_agents * K, self.num_future_steps, H).transpose(0, 1)
        m = self.traj_emb(m, self.traj_emb_h0.expand(num_agents * K, H))
        m = attend(m, self.t2m_refine_attn_layers, self.pl2m_refine_attn_layers, self.a2m_refine_attn_layers,
                   self.m2m_refine_attn_layer)
        loc_refine = self._head(self.to_loc_refine_pos, m).view(shape) + loc_propose.detach()
        scale_refine = F.elu(self._head(self.to_scale_refine_pos, m).view(shape)) + 1.0 + 0.1
        pi = self._head(self.to_pi, m).view(num_agents, K)
        return {
            "loc_propose_pos": loc_propose,
            "scale_propose_pos": scale_propose,
            "loc_refine_pos": loc_refine,
            "scale_refine_pos": scale_refine,
            "pi": pi,
        }
