"""MapTR model: registry entry, shapes, gradients, temporal path, overfitting, parameter counts."""

from __future__ import annotations

import pytest
import torch
import torchvision

from drivebench.models import create_model, get_spec
from drivebench.models.maptr.criterion import MapTRCriterion
from drivebench.models.maptr.grid_mask import GridMask
from drivebench.models.maptr.postprocess import decode_top_k
from drivebench.models.maptr.synthetic import random_map_batch

TEST_HW = (64, 96)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """The test size is op-overhead bound: one thread is faster than two busy cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def batch():
    return random_map_batch(2, TEST_HW, valid_hw=(54, 96), seed=0)


def _model(**overrides):
    torch.manual_seed(0)
    return create_model("maptr", "test", **overrides)


def test_registry_declares_sizes_and_their_input_contract():
    spec = get_spec("maptr")
    assert spec.default_size == "tiny" and set(spec.sizes) == {"tiny", "nano", "test"}
    inputs = spec.meta["inputs"]
    assert inputs["tiny"]["image_hw"] == (480, 800) and inputs["tiny"]["valid_hw"] == (450, 800)
    for size, contract in inputs.items():
        assert tuple(contract["bev_hw"]) == tuple(spec.sizes[size]["bev_hw"])
        assert contract["image_hw"][0] % 32 == 0 and contract["image_hw"][1] % 32 == 0
        assert contract["pc_range"] == spec.sizes[size]["pc_range"]


def test_batch_factory_follows_the_contract(batch):
    b = 2
    assert batch["img"].shape == (b, 6, 3, *TEST_HW) and batch["img"].dtype == torch.float32
    assert batch["lidar2img"].shape == (b, 6, 4, 4) and batch["can_bus"].shape == (b, 18)
    assert batch["img_shape"].shape == (b, 6, 2) and batch["prev_exists"].dtype == torch.bool
    for pts, labels, n_ord in zip(batch["gt_map_pts"], batch["gt_map_labels"], batch["gt_map_num_orderings"]):
        assert pts.shape[1:] == (19, 20, 2) and pts.shape[0] == labels.shape[0] == n_ord.shape[0]
        for i in range(len(labels)):
            assert (pts[i, n_ord[i]:] == -10000).all() and (pts[i, :n_ord[i]].abs() <= 30).all()


def test_forward_shapes_and_points_inside_the_bev_range(batch):
    model = _model().eval()
    with torch.no_grad():
        out = model(batch)
    assert out["cls_logits"].shape == (2, 2, 6, 3)
    assert out["pts_norm"].shape == out["pts"].shape == (2, 2, 6, 20, 2)
    assert out["bev"].shape == (2, 20 * 10, 32)
    assert out["pts"][..., 0].abs().max() <= 15 and out["pts"][..., 1].abs().max() <= 30
    assert torch.isfinite(out["cls_logits"]).all()


def test_loss_is_finite_and_every_trainable_parameter_gets_a_gradient(batch):
    model = _model().train()
    crit = MapTRCriterion(model.pc_range)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=1e-2)
    for _ in range(2):  # the BEV positions only reach TSA through zero-initialised offset/weight layers
        losses = crit(model(batch), batch["gt_map_labels"], batch["gt_map_pts"], batch["gt_map_num_orderings"])
        assert all(torch.isfinite(v) for v in losses.values())
        opt.zero_grad()
        losses["loss"].backward()
        opt.step()
    missing = [n for n, p in model.named_parameters() if p.requires_grad and (p.grad is None or not p.grad.any())]
    assert missing == []
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    assert frozen and all(n.startswith("image_encoder.backbone.") for n in frozen)  # stem + layer1


def test_overfits_a_fixed_batch(batch):
    model = _model(dropout=0.0).train()
    crit = MapTRCriterion(model.pc_range)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-3, weight_decay=0.01)
    history = []
    for _ in range(30):
        losses = crit(model(batch), batch["gt_map_labels"], batch["gt_map_pts"], batch["gt_map_num_orderings"])
        opt.zero_grad()
        losses["loss"].backward()
        opt.step()
        history.append(float(losses["loss"].detach()))
    assert history[-1] < 0.5 * history[0], history


def test_temporal_path_without_history_equals_single_frame(batch):
    model = _model().eval()
    prev = torch.randn(2, 200, 32)
    prev_can = batch["can_bus"].clone()
    prev_can[:, :2] -= torch.tensor([1.0, 0.5])
    prev_can[:, 17] -= 2.0
    no_history = dict(batch, prev_exists=torch.tensor([False, False]))
    mixed = dict(batch, prev_exists=torch.tensor([True, False]))
    with torch.no_grad():
        single = model(batch)["bev"]
        masked = model(no_history, prev_bev=prev, prev_can_bus=prev_can)["bev"]
        temporal = model(mixed, prev_bev=prev, prev_can_bus=prev_can)["bev"]
    torch.testing.assert_close(masked, single)
    torch.testing.assert_close(temporal[1], single[1])
    assert not torch.allclose(temporal[0], single[0])
    with pytest.raises(ValueError, match="prev_can_bus"):
        model(batch, prev_bev=prev)


def test_previous_bev_rotation():
    model = _model()
    enc = model.bev_encoder
    enc.rotate_center = (5.0, 10.0)  # the middle of the 20 x 10 test grid
    bev = torch.randn(1, 200, 4)
    same = enc._rotate_bev(bev, torch.zeros(1))
    torch.testing.assert_close(same, bev)
    half_turn = enc._rotate_bev(bev, torch.full((1,), 180.0)).view(20, 10, 4)
    torch.testing.assert_close(half_turn, bev.view(20, 10, 4).flip(0, 1))


def test_grid_mask_only_in_training():
    imgs = torch.ones(2, 6, 3, 64, 96)
    mask = GridMask(prob=1.0).train()
    torch.manual_seed(0)
    out = mask(imgs)
    assert 0 < (out == 0).float().mean() < 1
    assert (out[0, 0, 0] == out[1, 5, 2]).all()  # one mask for the whole batch
    assert torch.equal(mask.eval()(imgs), imgs)
    assert torch.equal(GridMask(prob=0.0).train()(imgs), imgs)


def test_decode_top_k_picks_highest_scoring_query_class_pairs():
    logits = torch.full((1, 4, 3), -5.0)
    logits[0, 2, 1] = 3.0
    logits[0, 0, 2] = 2.0
    logits[0, 2, 0] = 1.0
    pts = torch.arange(4, dtype=torch.float32).view(1, 4, 1, 1).expand(1, 4, 20, 2)
    out = decode_top_k(logits, pts, 3)
    assert out["labels"].tolist() == [[1, 2, 0]]
    assert out["pts"][0, :, 0, 0].tolist() == [2.0, 0.0, 2.0]  # a query may appear under two classes
    assert decode_top_k(logits, pts, 50)["scores"].shape == (1, 12)


@pytest.mark.parametrize("size,expected", [("tiny", 36.2e6), ("nano", 15.4e6)])
def test_parameter_counts_match_the_analytic_upstream_counts(size, expected):
    model = create_model("maptr", size)
    count = sum(p.numel() for p in model.parameters())
    print(f"maptr {size}: {count / 1e6:.2f}M parameters")
    assert abs(count - expected) / expected < 0.03


def test_head_stays_fp32_under_autocast_unless_asked(batch):
    model = _model().eval()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert model(batch)["pts"].dtype == torch.float32
        model.head_fp32 = False
        assert model(batch)["pts"].dtype == torch.bfloat16


def test_backbone_weights_load_from_a_local_file(tmp_path):
    reference = torchvision.models.resnet18(weights=None)
    path = tmp_path / "resnet18.pth"
    torch.save(reference.state_dict(), path)
    model = create_model("maptr", "nano", backbone_weights=str(path))
    torch.testing.assert_close(model.image_encoder.backbone.stem[0].weight, reference.conv1.weight)
    torch.testing.assert_close(model.image_encoder.backbone.stages[3][1].conv2.weight, reference.layer4[1].conv2.weight)
    with pytest.raises(FileNotFoundError, match="backbone weights"):
        create_model("maptr", "test", backbone_weights=str(tmp_path / "missing.pth"))
