"""QCNet end to end on tiny random scenes: shapes, gradients, learning, size, precision, compile."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from drivebench.models import create_model, get_spec
from drivebench.models.qcnet import QCNetLoss, collate_qcnet, make_transform
from drivebench.models.qcnet.random_scenario import random_batch

UPSTREAM_PARAMS = 7_660_673  # upstream QCNet, AV2 paper settings, measured
FIXTURE = Path(__file__).parent / "fixtures" / "av2-real" / "split"
SMALL_SCENE = dict(num_agents=6, num_polygons=16, extent=60.0)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tiny_batch():
    return random_batch(make_transform("test"), num_scenes=4, **SMALL_SCENE)


def _tiny(**overrides):
    torch.manual_seed(0)
    return create_model("qcnet", "test", **overrides)


def test_paper_size_has_upstreams_parameter_count():
    net = create_model("qcnet", "paper")
    count = sum(p.numel() for p in net.parameters())
    print(f"qcnet paper parameters: {count:,} (upstream {UPSTREAM_PARAMS:,})")
    assert abs(count - UPSTREAM_PARAMS) <= 0.01 * UPSTREAM_PARAMS
    assert net.transform_kwargs == vars(make_transform("paper").settings)
    assert get_spec("qcnet").default_size == "paper"


def test_tiny_forward_backward_shapes_finite_and_every_parameter_gets_a_gradient(tiny_batch):
    net = _tiny()
    start = time.perf_counter()
    out = net(tiny_batch)
    losses = QCNetLoss()(out, tiny_batch)
    losses["loss"].backward()
    elapsed = time.perf_counter() - start
    num_agents = tiny_batch["agent_position"].shape[0]
    for key in ("loc_propose_pos", "scale_propose_pos", "loc_refine_pos", "scale_refine_pos"):
        assert out[key].shape == (num_agents, 6, 60, 2), key
        assert torch.isfinite(out[key]).all(), key
    assert out["pi"].shape == (num_agents, 6)
    assert (out["scale_propose_pos"] > 0.1).all() and (out["scale_refine_pos"] > 0.1).all()
    assert set(losses) == {"loss", "reg_loss_propose", "reg_loss_refine", "cls_loss"}
    assert all(torch.isfinite(v) for v in losses.values())
    total = losses["reg_loss_propose"] + losses["reg_loss_refine"] + losses["cls_loss"]
    torch.testing.assert_close(losses["loss"], total)
    missing = [n for n, p in net.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert not missing, f"no finite gradient for {missing}"
    assert sum(float(p.grad.abs().sum()) for p in net.parameters()) > 0
    print(f"tiny forward+backward, 4 small scenes: {elapsed:.3f} s")


def test_tiny_model_overfits_a_fixed_batch():
    batch = random_batch(make_transform("test"), num_scenes=2, seed=3, num_agents=4, num_polygons=10, extent=50.0)
    net = _tiny(dropout=0.0)
    criterion = QCNetLoss()
    optimizer = torch.optim.AdamW(net.parameters(), lr=3e-3)
    history = []
    for _ in range(30):
        loss = criterion(net(batch), batch)["loss"]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        history.append(float(loss.detach()))
    assert history[-1] < 0.5 * history[0], history


def test_bf16_autocast_forward_on_cpu(tiny_batch):
    net = _tiny().eval()
    criterion = QCNetLoss()
    with torch.no_grad():
        fp32 = criterion(net(tiny_batch), tiny_batch)["loss"]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = net(tiny_batch)
            bf16 = criterion(out, tiny_batch)["loss"]
    assert out["loc_refine_pos"].dtype == torch.float32  # the output heads run in float32 (output_heads_fp32)
    assert bf16.dtype == torch.float32 and torch.isfinite(bf16)
    assert abs(float(bf16) - float(fp32)) < 0.05 * abs(float(fp32))


def test_output_heads_fp32_keeps_every_head_output_float32_under_bf16_autocast(tiny_batch):
    """With ``output_heads_fp32`` the heads run outside autocast: the mode logits and scales come out float32,
    close to the bf16 ones but with more digits; without it they are bf16. Same weights either way (the knob
    adds no parameters)."""
    plain, fp32_heads = _tiny(output_heads_fp32=False).eval(), _tiny().eval()
    assert plain.state_dict().keys() == fp32_heads.state_dict().keys()
    fp32_heads.load_state_dict(plain.state_dict())
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        rounded, kept = plain(tiny_batch), fp32_heads(tiny_batch)
    assert rounded["pi"].dtype == rounded["scale_refine_pos"].dtype == torch.bfloat16
    assert all(kept[key].dtype == torch.float32 for key in ("pi", "scale_refine_pos", "scale_propose_pos"))
    torch.testing.assert_close(kept["pi"].bfloat16(), rounded["pi"], atol=0.05, rtol=0.02)
    assert not torch.equal(kept["pi"], rounded["pi"].float())  # more than bf16's digits survive


def test_forward_captures_as_one_graph_without_breaks(tiny_batch):
    """No graph break means no .item(), nonzero, boolean-mask indexing or data-dependent Python branch."""
    net = _tiny().eval()
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(net)(tiny_batch)
    torch._dynamo.reset()
    assert explanation.graph_break_count == 0, [str(r.reason)[:200] for r in explanation.break_reasons]
    assert explanation.graph_count == 1


@pytest.mark.slow
def test_inductor_hot_layers_match_eager():
    """Inductor (dynamic shapes) on a Fourier embedding + grouped edge attention: same output and grads."""
    from drivebench.models.qcnet.layers import AttentionLayer, FourierEmbedding

    torch.manual_seed(0)
    layer = AttentionLayer(16, 2, 8, dropout=0.0, bipartite=True, has_pos_emb=True)
    emb = FourierEmbedding(3, 16, 4)

    def block(x_src, x_dst, r_raw, edges):
        return layer((x_src, x_dst), emb(r_raw), edges, group_size=2)

    torch._dynamo.reset()
    compiled = torch.compile(block, dynamic=True)
    for num_edges, num_groups in ((40, 7), (55, 5)):
        x_src = torch.randn(9, 16)
        x_dst = torch.randn(2 * num_groups, 16, requires_grad=True)
        edges = torch.stack([torch.randint(0, 9, (num_edges,)), torch.randint(0, num_groups, (num_edges,))])
        r = torch.randn(num_edges, 3) * 30
        got, want = compiled(x_src, x_dst, r, edges), block(x_src, x_dst, r, edges)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(torch.autograd.grad(got.sum(), x_dst)[0], torch.autograd.grad(want.sum(), x_dst)[0],
                                   rtol=1e-4, atol=1e-5)
    torch._dynamo.reset()


@pytest.mark.skipif(not FIXTURE.is_dir(), reason="real Argoverse 2 fixture missing")
def test_tiny_model_on_the_real_argoverse2_scenario():
    from drivebench.data.argoverse2.scenario import load_scenario_dir

    transform = make_transform("test")
    batch = collate_qcnet([transform(load_scenario_dir(next(FIXTURE.iterdir())))])
    with torch.no_grad():
        losses = QCNetLoss()(_tiny()(batch), batch)
    assert all(torch.isfinite(v) for v in losses.values())


def test_compile_scope_selects_the_units_accel_compiles():
    from drivebench.models.qcnet.layers import AttentionLayer, FourierEmbedding, TrajectoryGRU

    assert create_model("qcnet", "test").compile_units() == {}
    units = create_model("qcnet", "test", compile_scope="layers").compile_units()
    assert len(units) > 10 and all(isinstance(m, (AttentionLayer, FourierEmbedding)) for m in units.values())
    with_gru = create_model("qcnet", "test", compile_scope="layers_gru").compile_units()
    assert set(with_gru) - set(units) == {"decoder.traj_emb"}  # the layers, and the GRU unrolled under compile
    assert isinstance(with_gru["decoder.traj_emb"], TrajectoryGRU)
    with pytest.raises(ValueError, match="compile_scope='all' is not valid"):
        create_model("qcnet", "test", compile_scope="all")
