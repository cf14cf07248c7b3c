"""SparseDrive: registry sizes, output shapes, finite losses, gradients, and learning on a tiny sequence."""

from __future__ import annotations

import pytest
import torch

from drivebench.models.registry import create_model, get_spec
from test_sparsedrive_factory import make_sequence, one_torch_thread  # noqa: F401 (autouse fixture)


def _test_model(**overrides) -> torch.nn.Module:
    torch.manual_seed(0)
    return create_model("sparsedrive", "test", **overrides)


def test_registry_sizes_and_metadata() -> None:
    spec = get_spec("sparsedrive")
    assert set(spec.sizes) == {"small", "test"} and spec.default_size == "small"
    assert spec.meta["input_size"] == (704, 256)
    assert len(spec.meta["detection_classes"]) == 10 and len(spec.meta["map_classes"]) == 3
    with pytest.raises(ValueError, match="stage"):
        create_model("sparsedrive", "test", stage=3)


@pytest.mark.parametrize("stage, analytic", [(1, 75.7e6), (2, 86.1e6)])
def test_small_parameter_count_is_close_to_upstream(stage: int, analytic: float) -> None:
    net = create_model("sparsedrive", "small", stage=stage)
    count = sum(p.numel() for p in net.parameters())
    print(f"sparsedrive small stage {stage}: {count / 1e6:.2f}M parameters (models.md: {analytic / 1e6:.1f}M)")
    assert abs(count - analytic) / analytic < 0.01
    assert (net.motion_head is None) == (stage == 1)


def test_output_shapes_and_finite_losses() -> None:
    net = _test_model()
    net.train()
    batch = make_sequence(1, batch_size=2)[0]
    out = net(batch)
    assert len(out.det.classification) == 2
    assert out.det.classification[-1].shape == (2, 24, 10)
    assert out.det.prediction[-1].shape == (2, 24, 11)
    assert out.det.quality[-1].shape == (2, 24, 2)
    assert out.map.prediction[-1].shape == (2, 8, 40) and out.map.classification[-1].shape == (2, 8, 3)
    assert out.motion.motion_reg[-1].shape == (2, 24, 6, 12, 2) and out.motion.motion_cls[-1].shape == (2, 24, 6)
    assert out.motion.plan_reg[-1].shape == (2, 1, 18, 6, 2) and out.motion.plan_status[-1].shape == (2, 1, 10)
    assert [tuple(d.shape) for d in out.depth] == [(2, 6, 16, 44), (2, 6, 8, 22), (2, 6, 4, 11)]
    losses = net.criterion(batch, out)
    expected = {"det_cls", "det_box", "det_cns", "det_yns", "map_cls", "map_line", "motion_cls", "motion_reg",
                "plan_cls", "plan_reg", "plan_status", "depth", "loss"}
    assert set(losses) == expected
    assert all(torch.isfinite(v) for v in losses.values())


def test_stage_one_has_no_motion_terms() -> None:
    net = _test_model(stage=1)
    net.train()
    batch = make_sequence(1, batch_size=2)[0]
    losses = net.criterion(batch, net(batch))
    assert not any(k.startswith(("motion", "plan")) for k in losses)
    assert torch.isfinite(losses["loss"])


def test_every_trainable_parameter_gets_a_gradient() -> None:
    # regression losses of every match (no score gate) and non-uniform aggregation weights, so that
    # even parameters that upstream's zero init leaves without signal on step one are reached
    net = _test_model(loss={"cls_threshold_to_reg": 0.0})
    for head in (net.det_head, net.map_head):
        for dfa in head.dfa:
            torch.nn.init.normal_(dfa.weights_fc.weight, std=0.1)
    net.train()
    frames = make_sequence(2, batch_size=2)
    net(frames[0])  # fill the streaming state so the temporal path runs below
    losses = net.criterion(frames[1], net(frames[1]))
    losses["loss"].backward()
    assert all(p.grad is not None for p in net.parameters() if p.requires_grad)
    # upstream's detection queries start from fixed all-zero features, so the first layer's learned
    # keypoint offsets see a zero input: their weight has a gradient tensor but it is always zero
    zero_input = {"det_head.dfa.0.kps.learnable_fc.weight"}
    missing = [n for n, p in net.named_parameters()
               if p.requires_grad and n not in zero_input and not p.grad.abs().sum() > 0]
    assert not missing, f"no gradient reached: {missing}"
    assert all(torch.isfinite(p.grad).all() for p in net.parameters() if p.grad is not None)
    frozen = {n for n, p in net.named_parameters() if not p.requires_grad}
    assert frozen == {"det_head.bank.instance_feature", "motion_head.queue.ego_anchor", "motion_head.motion_anchor",
                      "motion_head.plan_anchor"}


def test_losses_fall_on_a_short_fixed_sequence() -> None:
    net = _test_model(loss={"cls_threshold_to_reg": 0.0}, grid_mask=False)
    net.train()
    frames = make_sequence(4, batch_size=2, seed=1)
    opt = torch.optim.AdamW([p for p in net.parameters() if p.requires_grad], lr=2e-3)
    history = []
    for _ in range(8):
        net.reset_state()  # each pass over the sequence is an epoch of the streaming sampler
        epoch = []
        for batch in frames:
            losses = net.criterion(batch, net(batch))
            opt.zero_grad()
            losses["loss"].backward()
            opt.step()
            epoch.append({k: float(v.detach()) for k, v in losses.items()})
        history.append({k: sum(e[k] for e in epoch) / len(epoch) for k in epoch[0]})
    first, last = history[0], history[-1]
    assert last["loss"] < 0.8 * first["loss"]
    for term in ("det_cls", "det_box", "map_cls", "map_line", "motion_reg", "plan_reg", "plan_status", "depth"):
        assert last[term] < first[term], f"{term} did not fall: {first[term]:.4f} -> {last[term]:.4f}"


def test_denoising_queries_train_without_disturbing_the_learned_queries() -> None:
    frames = make_sequence(2, batch_size=2)
    plain = _test_model(grid_mask=False)
    noisy = _test_model(grid_mask=False, num_dn_groups=2)
    noisy.load_state_dict(plain.state_dict())
    for net in (plain, noisy):
        net.train()
        for head in (net.det_head, net.map_head):
            for dfa in head.dfa:
                dfa.attn_drop = 0.0  # no randomness besides the noise of the noisy queries
    outs = []
    for net in (plain, noisy):
        net(frames[0])
        outs.append(net(frames[1]))
    for a, b in zip(outs[0].det.prediction, outs[1].det.prediction):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    dn = outs[1].det.dn
    n_gt = max(len(x) for x in frames[1]["gt_boxes_3d"])
    assert dn is not None and dn.prediction[-1].shape == (2, 2 * 2 * n_gt, 11)
    losses = noisy.criterion(frames[1], outs[1])
    assert {"det_dn_cls", "det_dn_box"} <= set(losses) and torch.isfinite(losses["loss"])
    losses["loss"].backward()
    noisy.eval()
    with torch.no_grad():
        assert noisy(frames[1]).det.dn is None  # denoising is a training-time device only
