"""QCNet's building blocks: Fourier embedding, MLP head, relative graph attention, trajectory GRU.

The math follows upstream QCNet (Zhou et al., CVPR 2023); the implementation is drivebench's:
edge attention is a gather + segment softmax + ``index_add`` (no PyG), the Fourier embedding
evaluates its per-feature MLPs as one batched matmul, and the attention layer fuses the
projections that share an input. Parameter counts equal upstream's layer for layer.
"""

from __future__ import annotations

import math
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from drivebench.models.qcnet.segment import segment_softmax, segment_sum


def init_weights(module: nn.Module) -> None:
    """Upstream QCNet's initialisation, applied with ``module.apply``."""
    if isinstance(module, nn.Linear):
        nn.init.xavier_uniform_(module.weight)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


class FourierEmbedding(nn.Module):
    """Embed ``D`` continuous features (plus optional categorical embeddings) into ``hidden_dim``.

    Each feature ``x_d`` becomes ``[cos(2 pi f x_d), sin(2 pi f x_d), x_d]`` with learnable
    frequencies ``f`` (``num_freq_bands`` of them), goes through its own
    Linear-LayerNorm-ReLU-Linear MLP, and the ``D`` results are summed; categorical embeddings are
    added, then LayerNorm-ReLU-Linear. Upstream runs the ``D`` MLPs in a Python loop; here their
    weights are stacked so all of them are two batched matmuls.

    Attributes ``weight_in`` / ``weight_out`` are the matmul weights (weight-decayed like upstream's
    Linear weights); ``freqs`` is an embedding, ``ln_*`` are norms, ``bias_*`` biases (not decayed).
    """

    decayed_parameters = ("weight_in", "weight_out")

    def __init__(self, input_dim: int, hidden_dim: int, num_freq_bands: int) -> None:
        super().__init__()
        self.input_dim = input_dim
        self.hidden_dim = hidden_dim
        self.num_freq_bands = num_freq_bands
        if input_dim > 0:
            feat_dim = 2 * num_freq_bands + 1
            self.freqs = nn.Embedding(input_dim, num_freq_bands)
            self.weight_in = nn.Parameter(torch.empty(input_dim, feat_dim, hidden_dim))
            self.bias_in = nn.Parameter(torch.zeros(input_dim, hidden_dim))
            self.ln_weight = nn.Parameter(torch.ones(input_dim, hidden_dim))
            self.ln_bias = nn.Parameter(torch.zeros(input_dim, hidden_dim))
            self.weight_out = nn.Parameter(torch.empty(input_dim, hidden_dim, hidden_dim))
            self.bias_out = nn.Parameter(torch.zeros(input_dim, hidden_dim))
        self.to_out = nn.Sequential(nn.LayerNorm(hidden_dim), nn.ReLU(inplace=True), nn.Linear(hidden_dim, hidden_dim))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        self.to_out.apply(init_weights)
        if self.input_dim == 0:
            return
        nn.init.normal_(self.freqs.weight, mean=0.0, std=0.02)
        feat_dim, hidden = self.weight_in.shape[1], self.hidden_dim
        for d in range(self.input_dim):  # xavier per feature, as for upstream's per-feature nn.Linear
            nn.init.uniform_(self.weight_in[d], -math.sqrt(6 / (feat_dim + hidden)), math.sqrt(6 / (feat_dim + hidden)))
            nn.init.uniform_(self.weight_out[d], -math.sqrt(6 / (2 * hidden)), math.sqrt(6 / (2 * hidden)))
        nn.init.zeros_(self.bias_in)
        nn.init.zeros_(self.bias_out)
        nn.init.ones_(self.ln_weight)
        nn.init.zeros_(self.ln_bias)

    def forward(self, continuous: torch.Tensor | None = None, categorical: torch.Tensor | None = None) -> torch.Tensor:
        """``continuous``: (..., D) float; ``categorical``: summed embeddings broadcastable to (..., H)."""
        if continuous is None:
            if categorical is None:
                raise ValueError("FourierEmbedding needs continuous inputs, categorical embeddings, or both")
            return self.to_out(categorical)
        if continuous.size(-1) != self.input_dim:
            raise ValueError(f"FourierEmbedding expects {self.input_dim} features, got shape {tuple(continuous.shape)}")
        lead = continuous.shape[:-1]
        x = continuous.reshape(-1, self.input_dim).float().t()  # (D, N)
        num_rows = x.size(1)
        angles = x.unsqueeze(-1) * self.freqs.weight.unsqueeze(1) * (2 * math.pi)  # (D, N, F)
        # [cos, sin, x] @ W_in as [cos, sin] @ W_in[:2F] + x * W_in[2F]: the matmul's inner size is then
        # 2F (128 at paper size), a multiple of 8 that the tensor-core kernels need; with 2F+1 cuBLAS falls
        # back to a slow kernel (QCNet on an H200: 24 of 166 ms of kernel time per step)
        trig = torch.cat([angles.cos(), angles.sin()], dim=-1)  # (D, N, 2F)
        base = torch.addcmul(self.bias_in.unsqueeze(1), x.unsqueeze(-1), self.weight_in[:, -1:, :])
        h = torch.baddbmm(base, trig, self.weight_in[:, :-1, :])  # (D, N, H): D matmuls in one
        # per-feature LayerNorm with per-feature affine: layer_norm over H of each (row, feature), then the
        # (D, H) affine. (GroupNorm with one group per feature is the same maths, but its backward kernel
        # reduces over the rows slowly: 21 of 166 ms per step on the H200.)
        h = F.layer_norm(h.transpose(0, 1), (self.hidden_dim,), eps=1e-5)  # (N, D, H)
        h = torch.addcmul(self.ln_bias, h, self.ln_weight)
        # sum_d (relu(h_d) W_d + b_d) as one matmul over the concatenated (d, hidden) axis
        h = torch.relu(h).reshape(num_rows, self.input_dim * self.hidden_dim)
        out = h @ self.weight_out.reshape(-1, self.hidden_dim) + self.bias_out.sum(0)
        out = out.reshape(*lead, self.hidden_dim)
        if categorical is not None:
            out = out + categorical
        return self.to_out(out)


class MLPLayer(nn.Sequential):
    """Linear-LayerNorm-ReLU-Linear output head (upstream ``MLPLayer``)."""

    def __init__(self, input_dim: int, hidden_dim: int, output_dim: int) -> None:
        super().__init__(
            nn.Linear(input_dim, hidden_dim), nn.LayerNorm(hidden_dim), nn.ReLU(inplace=True),
            nn.Linear(hidden_dim, output_dim),
        )
        self.apply(init_weights)


def _bias_or_zeros(linear: nn.Linear) -> torch.Tensor:
    return linear.bias if linear.bias is not None else linear.weight.new_zeros(linear.out_features)


def _fused_linear(x: torch.Tensor, first: nn.Linear, second: nn.Linear) -> tuple[torch.Tensor, torch.Tensor]:
    """``first(x), second(x)`` as one matmul over concatenated weights (a missing bias is zeros)."""
    weight = torch.cat([first.weight, second.weight], dim=0)
    bias = torch.cat([_bias_or_zeros(first), _bias_or_zeros(second)], dim=0)
    out = F.linear(x, weight, bias)
    return out[..., : first.out_features], out[..., first.out_features:]


class AttentionLayer(nn.Module):
    """QCNet's gated multi-head attention over an edge list, with relative-position embeddings.

    For an edge ``j -> i`` with relative embedding ``r_ij``: ``k_ij = W_k x_j + W_kr r_ij``,
    ``v_ij = W_v x_j + W_vr r_ij``, softmax of ``q_i . k_ij / sqrt(d)`` over the edges into ``i``,
    the weighted ``v`` sum ``a_i`` is gated with the destination's own projection
    (``a_i + g * (W_s x_i - a_i)``, ``g = sigmoid(W_g [a_i, x_i])``), then pre/post-normed residual
    attention and feed-forward blocks as upstream.

    ``forward(x, r, edge_index, group_size=1)``: ``x`` is the node tensor (self-attention) or a
    ``(x_src, x_dst)`` pair (bipartite); ``edge_index`` is (2, E) ``[src; dst]``; ``r`` is
    (E, hidden) or None. With ``group_size=G`` the destination rows come in groups of ``G``
    consecutive queries (row ``n * G + g``) that all receive the same edges: ``dst`` indexes the
    group ``n``. This is how the decoder's K mode queries of one agent share their t2m/pl2m/a2m
    edges: keys, values and relative embeddings are computed once per edge instead of K times,
    which is exactly upstream's result on K copies of each edge at a fraction of the work.
    """

    def __init__(self, hidden_dim: int, num_heads: int, head_dim: int, dropout: float, bipartite: bool,
                 has_pos_emb: bool) -> None:
        super().__init__()
        inner = num_heads * head_dim
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.has_pos_emb = has_pos_emb
        self.bipartite = bipartite
        self.scale = head_dim ** -0.5
        self.to_q = nn.Linear(hidden_dim, inner)
        self.to_k = nn.Linear(hidden_dim, inner, bias=False)
        self.to_v = nn.Linear(hidden_dim, inner)
        if has_pos_emb:
            self.to_k_r = nn.Linear(hidden_dim, inner, bias=False)
            self.to_v_r = nn.Linear(hidden_dim, inner)
        self.to_s = nn.Linear(hidden_dim, inner)
        self.to_g = nn.Linear(inner + hidden_dim, inner)
        self.to_out = nn.Linear(inner, hidden_dim)
        self.attn_drop = nn.Dropout(dropout)
        self.ff_mlp = nn.Sequential(
            nn.Linear(hidden_dim, hidden_dim * 4), nn.ReLU(inplace=True), nn.Dropout(dropout),
            nn.Linear(hidden_dim * 4, hidden_dim),
        )
        self.attn_prenorm_x_src = nn.LayerNorm(hidden_dim)
        self.attn_prenorm_x_dst = nn.LayerNorm(hidden_dim) if bipartite else self.attn_prenorm_x_src
        if has_pos_emb:
            self.attn_prenorm_r = nn.LayerNorm(hidden_dim)
        self.attn_postnorm = nn.LayerNorm(hidden_dim)
        self.ff_prenorm = nn.LayerNorm(hidden_dim)
        self.ff_postnorm = nn.LayerNorm(hidden_dim)
        self.apply(init_weights)

    def forward(self, x: torch.Tensor | tuple[torch.Tensor, torch.Tensor], r: torch.Tensor | None,
                edge_index: torch.Tensor, group_size: int = 1) -> torch.Tensor:
        if isinstance(x, torch.Tensor):
            x_src = x_dst = self.attn_prenorm_x_src(x)
        else:
            x_src = self.attn_prenorm_x_src(x[0])
            x_dst = self.attn_prenorm_x_dst(x[1])
            x = x[1]
        if self.has_pos_emb and r is not None:
            r = self.attn_prenorm_r(r)
        x = x + self.attn_postnorm(self._attn_block(x_src, x_dst, r, edge_index, group_size))
        x = x + self.ff_postnorm(self.ff_mlp(self.ff_prenorm(x)))
        return x

    def _attn_block(self, x_src: torch.Tensor, x_dst: torch.Tensor, r: torch.Tensor | None,
                    edge_index: torch.Tensor, group_size: int) -> torch.Tensor:
        src, dst = edge_index[0], edge_index[1]
        heads, dim, groups = self.num_heads, self.head_dim, group_size
        num_groups, num_edges = x_dst.size(0) // groups, src.size(0)
        q, s = _fused_linear(x_dst, self.to_q, self.to_s)
        k, v = _fused_linear(x_src, self.to_k, self.to_v)
        # gathered in float32 (the per-edge maths is float32 anyway): one cast per node instead of per
        # edge, and the gathers' backward (index_add with atomics) accumulates in float32, which is
        # faster than bf16 atomics and does not round every edge's contribution to bf16
        k_j, v_j = k.float().index_select(0, src), v.float().index_select(0, src)
        if self.has_pos_emb and r is not None:
            k_r, v_r = _fused_linear(r, self.to_k_r, self.to_v_r)
            k_j, v_j = k_j + k_r, v_j + v_r
        q_i = q.float().reshape(num_groups, groups * heads * dim).index_select(0, dst)
        sim = (q_i.view(num_edges, groups, heads, dim) * k_j.view(num_edges, 1, heads, dim)).sum(-1)
        attn = segment_softmax(sim.view(num_edges, groups * heads) * self.scale, dst, num_groups)
        attn = self.attn_drop(attn).view(num_edges, groups, heads, 1)
        msg = v_j.view(num_edges, 1, heads, dim) * attn
        agg = segment_sum(msg.view(num_edges, groups * heads * dim), dst, num_groups).view(-1, heads * dim)
        gate = torch.sigmoid(self.to_g(torch.cat([agg.to(x_dst.dtype), x_dst], dim=-1)))
        out = agg + gate * (s - agg)
        return self.to_out(out)


class TrajectoryGRU(nn.Module):
    """One-layer GRU returning its final hidden state: upstream's ``traj_emb`` (``nn.GRU``).

    Same parameters, names and equations as ``nn.GRU(hidden, hidden)``. It is its own module
    because Dynamo refuses to trace ``nn.GRU`` (graph break) unless a global flag is flipped:
    eagerly it runs the fused ``torch.gru`` kernel, under ``torch.compile`` the recurrence is
    unrolled into plain ops (what Inductor would do with ``nn.GRU`` anyway).
    """

    decayed_parameters = ("weight_ih_l0", "weight_hh_l0")

    def __init__(self, input_size: int, hidden_size: int) -> None:
        super().__init__()
        self.weight_ih_l0 = nn.Parameter(torch.empty(3 * hidden_size, input_size))
        self.weight_hh_l0 = nn.Parameter(torch.empty(3 * hidden_size, hidden_size))
        self.bias_ih_l0 = nn.Parameter(torch.zeros(3 * hidden_size))
        self.bias_hh_l0 = nn.Parameter(torch.zeros(3 * hidden_size))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Upstream's GRU init: xavier input blocks, orthogonal recurrent blocks, zero biases."""
        for block in self.weight_ih_l0.data.chunk(3, 0):
            nn.init.xavier_uniform_(block)
        for block in self.weight_hh_l0.data.chunk(3, 0):
            nn.init.orthogonal_(block)
        nn.init.zeros_(self.bias_ih_l0)
        nn.init.zeros_(self.bias_hh_l0)

    def forward(self, x: torch.Tensor, h0: torch.Tensor) -> torch.Tensor:
        """``x`` (T, N, C), ``h0`` (N, H) -> final hidden state (N, H), computed in float32 under any autocast.

        Why float32: CUDA autocast runs ``torch.gru`` through cuDNN in float16 whatever its own dtype (PyTorch's
        autocast wrapper of cuDNN RNNs casts to half), so under ``bf16-mixed``, which has no loss scaling, the
        recurrence over the 60 future steps and its backward ran in float16, and every gradient that reaches
        the refinement stage's trajectory embedding passes through it. The GRU is a small share of a step.
        """
        with torch.autocast(x.device.type, enabled=False):
            x, h0 = x.float(), h0.float()
            if torch.compiler.is_compiling():
                return self._unrolled(x, h0)
            weights = (self.weight_ih_l0, self.weight_hh_l0, self.bias_ih_l0, self.bias_hh_l0)
            with warnings.catch_warnings():
                # cuDNN copies the four weights into one buffer per call (~0.1M values) and warns about it
                warnings.filterwarnings("ignore", message="RNN module weights are not part of single contiguous")
                out = torch.gru(x, h0.unsqueeze(0).contiguous(), weights, True, 1, 0.0, self.training, False, False)
        return out[1].squeeze(0)

    def _unrolled(self, x: torch.Tensor, h0: torch.Tensor) -> torch.Tensor:
        gates_x = F.linear(x, self.weight_ih_l0, self.bias_ih_l0)  # (T, N, 3H): all input projections at once
        h = h0
        for t in range(x.size(0)):
            gates_h = F.linear(h, self.weight_hh_l0, self.bias_hh_l0)
            xr, xz, xn = gates_x[t].chunk(3, dim=-1)
            hr, hz, hn = gates_h.chunk(3, dim=-1)
            reset = torch.sigmoid(xr + hr)
            update = torch.sigmoid(xz + hz)
            cand = torch.tanh(xn + reset * hn)
            h = (1 - update) * cand + update * h
        return h
