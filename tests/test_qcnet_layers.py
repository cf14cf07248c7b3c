"""QCNet layers against slow, obviously-correct references: attention, grouped attention, Fourier embedding, GRU."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from drivebench.models.qcnet.layers import AttentionLayer, FourierEmbedding, TrajectoryGRU
from drivebench.models.qcnet.segment import segment_softmax

HIDDEN, HEADS, HEAD_DIM = 16, 2, 8


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _dense_attention(layer: AttentionLayer, x_src, x_dst_raw, r, edge_index, group_size=1):
    """The same layer evaluated one destination query at a time with a plain softmax over its in-edges."""
    xs = layer.attn_prenorm_x_src(x_src)
    xd = layer.attn_prenorm_x_dst(x_dst_raw)
    rn = layer.attn_prenorm_r(r) if r is not None else None
    inner = HEADS * HEAD_DIM
    rows = []
    for i in range(x_dst_raw.size(0)):
        incoming = (edge_index[1] == i // group_size).nonzero().flatten()
        q = layer.to_q(xd[i]).view(HEADS, HEAD_DIM)
        s = layer.to_s(xd[i])
        if incoming.numel() == 0:
            agg = torch.zeros(inner)
        else:
            src = edge_index[0, incoming]
            k = layer.to_k(xs[src])
            v = layer.to_v(xs[src])
            if rn is not None:
                k = k + layer.to_k_r(rn[incoming])
                v = v + layer.to_v_r(rn[incoming])
            k, v = k.view(-1, HEADS, HEAD_DIM), v.view(-1, HEADS, HEAD_DIM)
            attn = torch.softmax((k * q).sum(-1) / math.sqrt(HEAD_DIM), dim=0)  # over the in-edges
            agg = (attn.unsqueeze(-1) * v).sum(0).reshape(inner)
        g = torch.sigmoid(layer.to_g(torch.cat([agg, xd[i]])))
        rows.append(agg + g * (s - agg))
    x = x_dst_raw + layer.attn_postnorm(layer.to_out(torch.stack(rows)))
    return x + layer.ff_postnorm(layer.ff_mlp(layer.ff_prenorm(x)))


def _random_graph(num_src, num_dst, num_edges, seed):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, num_src, (num_edges,), generator=g)
    dst = torch.randint(0, num_dst - 1, (num_edges,), generator=g)  # the last destination gets no edge
    return torch.stack([src, dst])


@pytest.mark.parametrize("bipartite,has_pos_emb", [(True, True), (False, True), (False, False)])
def test_edge_attention_matches_dense_reference_forward_and_gradients(bipartite, has_pos_emb):
    torch.manual_seed(0)
    layer = AttentionLayer(HIDDEN, HEADS, HEAD_DIM, dropout=0.0, bipartite=bipartite, has_pos_emb=has_pos_emb)
    num_src, num_dst = (9, 7) if bipartite else (7, 7)
    x_src = torch.randn(num_src, HIDDEN, requires_grad=True)
    x_dst = torch.randn(num_dst, HIDDEN, requires_grad=True) if bipartite else x_src
    edges = _random_graph(num_src, num_dst, 30, seed=1)
    r = torch.randn(edges.size(1), HIDDEN, requires_grad=True) if has_pos_emb else None

    got = layer((x_src, x_dst) if bipartite else x_src, r, edges)
    want = _dense_attention(layer, x_src, x_dst, r, edges)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # a destination without in-edges still gets the gated update of a zero message
    assert not torch.allclose(got[-1], x_dst[-1])

    inputs = [x_src] + ([x_dst] if bipartite else []) + ([r] if has_pos_emb else []) + list(layer.parameters())
    weights = torch.randn_like(got)
    grads_got = torch.autograd.grad((got * weights).sum(), inputs, allow_unused=True)
    grads_want = torch.autograd.grad((want * weights).sum(), inputs, allow_unused=True)
    for a, b in zip(grads_got, grads_want):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_grouped_queries_equal_attention_on_edges_copied_per_query():
    """The decoder's group_size=K path is upstream's K copies of every edge, computed once per edge."""
    torch.manual_seed(0)
    K, num_src, num_agents = 3, 8, 5
    layer = AttentionLayer(HIDDEN, HEADS, HEAD_DIM, dropout=0.0, bipartite=True, has_pos_emb=True)
    x_src = torch.randn(num_src, HIDDEN, requires_grad=True)
    m = torch.randn(num_agents * K, HIDDEN, requires_grad=True)
    edges = _random_graph(num_src, num_agents, 20, seed=2)
    r = torch.randn(edges.size(1), HIDDEN, requires_grad=True)

    grouped = layer((x_src, m), r, edges, group_size=K)
    modes = torch.arange(K)
    copied = torch.stack([edges[0].repeat_interleave(K), (edges[1, :, None] * K + modes).reshape(-1)])
    reference = layer((x_src, m), r.repeat_interleave(K, dim=0), copied)
    torch.testing.assert_close(grouped, reference, atol=1e-5, rtol=1e-5)
    w = torch.randn_like(grouped)
    for a, b in zip(torch.autograd.grad((grouped * w).sum(), [x_src, m, r]),
                    torch.autograd.grad((reference * w).sum(), [x_src, m, r])):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_segment_softmax_sums_to_one_per_segment_and_survives_large_logits():
    scores = torch.tensor([[1000.0], [1001.0], [-5.0], [3.0]])
    index = torch.tensor([0, 0, 2, 2])
    out = segment_softmax(scores, index, num_segments=3)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out[:2, 0], torch.softmax(torch.tensor([1000.0, 1001.0]), 0))
    torch.testing.assert_close(out[2:, 0].sum(), torch.tensor(1.0))
    assert segment_softmax(scores.bfloat16(), index, 3).dtype == torch.float32


def test_fourier_embedding_equals_per_feature_mlps():
    """Batched stacked weights == upstream's loop of per-feature Linear-LayerNorm-ReLU-Linear."""
    torch.manual_seed(0)
    emb = FourierEmbedding(input_dim=3, hidden_dim=HIDDEN, num_freq_bands=5)
    with torch.no_grad():  # non-trivial norm parameters so that a per-feature mix-up would show
        emb.ln_weight.uniform_(0.5, 1.5)
        emb.ln_bias.normal_()
        emb.bias_in.normal_()
        emb.bias_out.normal_()
    x = torch.randn(11, 3) * 20
    cat = torch.randn(11, HIDDEN)
    want = torch.zeros(11, HIDDEN)
    for d in range(3):
        angles = x[:, d:d + 1] * emb.freqs.weight[d] * 2 * math.pi
        feats = torch.cat([angles.cos(), angles.sin(), x[:, d:d + 1]], dim=-1)
        h = feats @ emb.weight_in[d] + emb.bias_in[d]
        h = F.layer_norm(h, (HIDDEN,), emb.ln_weight[d], emb.ln_bias[d])
        want = want + torch.relu(h) @ emb.weight_out[d] + emb.bias_out[d]
    want = emb.to_out(want + cat)
    torch.testing.assert_close(emb(x, cat), want, atol=1e-5, rtol=1e-5)
    # leading dims are kept and categorical embeddings broadcast
    assert emb(x.view(11, 1, 3).expand(11, 4, 3), cat.unsqueeze(1)).shape == (11, 4, HIDDEN)
    only_categorical = FourierEmbedding(input_dim=0, hidden_dim=HIDDEN, num_freq_bands=5)
    torch.testing.assert_close(only_categorical(None, cat), only_categorical.to_out(cat))


def test_trajectory_gru_matches_nn_gru_eager_and_unrolled():
    torch.manual_seed(0)
    ours = TrajectoryGRU(6, 6)
    ref = torch.nn.GRU(6, 6)
    with torch.no_grad():
        ours.bias_ih_l0.normal_()
        ours.bias_hh_l0.normal_()
        for name, p in ref.named_parameters():
            p.copy_(getattr(ours, name))
    x, h0 = torch.randn(7, 4, 6), torch.randn(4, 6)
    want = ref(x, h0.unsqueeze(0))[1][0]
    torch.testing.assert_close(ours(x, h0), want)
    torch.testing.assert_close(ours._unrolled(x, h0), want, atol=1e-6, rtol=1e-5)
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in ref.named_parameters()]


def test_trajectory_gru_keeps_float32_under_bf16_autocast_eager_and_compiled():
    """The recurrence runs in float32 whatever autocast says (CUDA autocast would run cuDNN's GRU in float16,
    without loss scaling under bf16-mixed); a bf16 input is taken as it is. Compiled (the unrolled path) its
    matmuls would otherwise be bf16."""
    torch.manual_seed(0)
    gru = TrajectoryGRU(16, 16)
    x, h0 = torch.randn(30, 8, 16), torch.randn(8, 16)
    want = gru(x, h0)
    compiled = torch.compile(gru, backend="eager", fullgraph=True)
    torch._dynamo.reset()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        eager, unrolled = gru(x.bfloat16(), h0), compiled(x, h0)
    torch._dynamo.reset()
    assert eager.dtype == unrolled.dtype == torch.float32
    torch.testing.assert_close(eager, gru(x.bfloat16().float(), h0))
    torch.testing.assert_close(unrolled, want, atol=1e-6, rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA autocast's cuDNN GRU")
def test_trajectory_gru_keeps_float32_under_cuda_bf16_autocast(monkeypatch):
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)  # restored after the test, not left for the next
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    torch.manual_seed(0)
    gru = TrajectoryGRU(128, 128).cuda()
    x, h0 = torch.randn(60, 64, 128, device="cuda"), torch.randn(64, 128, device="cuda")
    want = gru(x, h0)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        got = gru(x, h0)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
