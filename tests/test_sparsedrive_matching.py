"""SparseDrive matching and loss terms on hand-made cases."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from drivebench.models.registry import create_model
from drivebench.models.sparsedrive.boxes import encode_boxes
from drivebench.models.sparsedrive.losses import winner_take_all
from drivebench.models.sparsedrive.map_loss import map_losses
from drivebench.models.sparsedrive.sparse_head import HeadOutput
from drivebench.models.sparsedrive.targets import hungarian_assign
from test_sparsedrive_factory import one_torch_thread  # noqa: F401 (autouse fixture)


@pytest.fixture(scope="module")
def criterion():
    torch.manual_seed(0)
    return create_model("sparsedrive", "test", loss={"cls_threshold_to_reg": 0.0}).criterion


def _state(x: float, y: float, yaw: float = 0.0, size=(2.0, 4.0, 1.5), vel=(0.0, 0.0)) -> torch.Tensor:
    box = torch.tensor([x, y, -1.0, *size, yaw, *vel])
    return torch.cat([encode_boxes(box), torch.zeros(1)])  # 11-d (vz = 0)


def _logits(label: int, n_cls: int = 10, high: float = 4.0) -> torch.Tensor:
    out = torch.full((n_cls,), -4.0)
    out[label] = high
    return out


def test_hungarian_assign_solves_each_sample_with_one_host_copy(monkeypatch) -> None:
    cost = torch.tensor([
        [[[1.0, 9.0], [9.0, 1.0], [5.0, 5.0]],  # sample 0: q0->g0, q1->g1
         [[7.0, 0.0], [0.5, 0.0], [float("nan"), 0.0]]],  # sample 1 has one target: q1 (NaN never wins)
    ])
    calls = []
    original = torch.Tensor.cpu
    monkeypatch.setattr(torch.Tensor, "cpu", lambda self, *a, **k: calls.append(1) or original(self, *a, **k))
    result = hungarian_assign(cost, counts=[2, 1])
    assert len(calls) == 1, "the assignment must copy the costs to the host exactly once"
    sample, query, target = result.per_layer[0]
    pairs = sorted(zip(sample.tolist(), query.tolist(), target.tolist()))
    assert pairs == [(0, 0, 0), (0, 1, 1), (1, 1, 0)]
    assert result.num_matched == [3]


def test_detection_matching_prefers_class_and_box_and_box_loss_vanishes_on_exact_boxes(criterion) -> None:
    boxes = torch.tensor([[10.0, 0.0, -1.0, 2.0, 4.0, 1.5, 0.3, 1.0, 0.0], [-5.0, 3.0, -1.0, 0.6, 0.6, 1.7, 1.0, 0.0, 0.5]])
    labels = torch.tensor([0, 8])
    pred = torch.stack([_state(10.0, 0.0, 0.3, vel=(1.0, 0.0)), encode_boxes(boxes[0]).new_zeros(11),
                        _state(-5.0, 3.0, 1.0, size=(0.6, 0.6, 1.7), vel=(0.0, 0.5))])
    pred[1] = torch.cat([encode_boxes(boxes[0]), torch.zeros(1)])  # exact box of GT 0, right class
    cls = torch.stack([_logits(3), _logits(0), _logits(8)])  # query 0: right place, wrong class
    out = SimpleNamespace(det=HeadOutput([cls[None]], [pred[None]], [torch.zeros(1, 3, 2)]))
    batch = {"gt_boxes_3d": [boxes], "gt_labels_3d": [labels]}
    losses: dict = {}
    _, assignment = criterion.detection(batch, out, losses)
    sample, query, target = assignment.per_layer[0]
    assert sorted(zip(query.tolist(), target.tolist())) == [(1, 0), (2, 1)]
    assert float(losses["det_box"]) == pytest.approx(0.0, abs=1e-6)
    assert float(losses["det_cls"]) > 0


def test_nan_velocity_targets_are_ignored(criterion) -> None:
    boxes = torch.tensor([[10.0, 0.0, -1.0, 2.0, 4.0, 1.5, 0.0, float("nan"), float("nan")]])
    pred = torch.cat([encode_boxes(torch.nan_to_num(boxes[0])), torch.zeros(1)])
    pred[8:10] = torch.tensor([3.0, -2.0])  # any velocity: no target to compare with
    out = SimpleNamespace(det=HeadOutput([_logits(0)[None, None]], [pred[None, None]], [None]))
    losses: dict = {}
    criterion.detection({"gt_boxes_3d": [boxes], "gt_labels_3d": [torch.tensor([0])]}, out, losses)
    assert torch.isfinite(losses["det_box"]) and float(losses["det_box"]) == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize("label, expect_zero", [(5, True), (0, False)])
def test_barriers_may_face_either_way(criterion, label: int, expect_zero: bool) -> None:
    box = torch.tensor([[10.0, 0.0, -1.0, 2.0, 4.0, 1.5, 0.4, 0.0, 0.0]])
    pred = torch.cat([encode_boxes(box[0]), torch.zeros(1)])
    pred[6:8] = -pred[6:8]  # heading reversed
    out = SimpleNamespace(det=HeadOutput([_logits(label)[None, None]], [pred[None, None]], [None]))
    losses: dict = {}
    criterion.detection({"gt_boxes_3d": [box], "gt_labels_3d": [torch.tensor([label])]}, out, losses)
    assert (float(losses["det_box"]) < 1e-6) == expect_zero


def test_map_matching_accepts_a_reversed_polyline_and_ignores_padded_orderings() -> None:
    xs = torch.linspace(-10, 10, 20)
    line = torch.stack([xs, torch.full_like(xs, 2.0)], -1)
    orderings = torch.full((4, 20, 2), -10000.0)
    orderings[0], orderings[1] = line, line.flip(0)
    far = torch.stack([xs * 0.2 + 20, torch.full_like(xs, -12.0)], -1)
    pred = torch.stack([far, line.flip(0)]).reshape(1, 2, 40)  # query 1 = the element, drawn backwards
    cls = torch.tensor([[[-4.0, -4.0, -4.0], [4.0, -4.0, -4.0]]])
    cls_loss, line_loss = map_losses([cls], [pred], [torch.tensor([0])], [orderings[None]], [torch.tensor([2])],
                                     roi=(60.0, 30.0), num_sample=20, cls_threshold_to_reg=0.0)
    assert float(line_loss) == pytest.approx(0.0, abs=1e-6)
    assert float(cls_loss) < 0.05
    shifted = [pred + 1.0]  # every point 1 m off: the loss is the smooth-L1 of the normalised offset
    _, off_loss = map_losses([cls], shifted, [torch.tensor([0])], [orderings[None]], [torch.tensor([2])],
                             roi=(60.0, 30.0), num_sample=20, cls_threshold_to_reg=0.0)
    expected = (1 / 60.00001 - 0.005) + (1 / 30.00001 - 0.005)  # per point, x and y
    assert float(off_loss) == pytest.approx(expected, rel=1e-3)


def test_winner_take_all_picks_the_mode_closest_on_valid_steps() -> None:
    target = torch.tensor([[1.0, 0.0], [2.0, 0.0], [3.0, 0.0]])
    modes = torch.stack([target + torch.tensor([0.0, 1.0]), target.clone(), target * 0])
    modes[1, 2] = torch.tensor([30.0, 0.0])  # the exact mode is wrong only on the last step
    assert int(winner_take_all(modes, target, torch.tensor([1.0, 1.0, 1.0]))) == 0
    assert int(winner_take_all(modes, target, torch.tensor([1.0, 1.0, 0.0]))) == 1


def test_planning_loss_reads_only_the_commanded_modes(criterion) -> None:
    torch.manual_seed(1)
    plan_reg = torch.randn(1, 1, 18, 6, 2)
    plan_cls = torch.randn(1, 1, 18)
    batch = {"gt_ego_fut_cmd": torch.tensor([[0.0, 1.0, 0.0]]), "gt_ego_fut_trajs": torch.randn(1, 6, 2).cumsum(1),
             "gt_ego_fut_masks": torch.ones(1, 6, dtype=torch.bool), "ego_status": torch.zeros(1, 10)}

    def plan_losses(reg, cls):
        out = SimpleNamespace(motion=SimpleNamespace(plan_cls=[cls], plan_reg=[reg], plan_status=[torch.zeros(1, 1, 10)]))
        losses: dict = {}
        criterion.planning(batch, out, losses)
        return losses

    base = plan_losses(plan_reg, plan_cls)
    other = plan_reg.clone()
    other[:, :, :6] += 5.0  # the "turn right" modes
    other[:, :, 12:] -= 5.0  # the "go straight" modes
    same = plan_losses(other, plan_cls)
    assert float(same["plan_reg"]) == pytest.approx(float(base["plan_reg"]))
    changed = plan_reg.clone()
    changed[:, :, 6:12] += 5.0  # the commanded "turn left" modes
    assert float(plan_losses(changed, plan_cls)["plan_reg"]) > float(base["plan_reg"])
    # an exact plan among the commanded modes gives zero regression loss
    exact = plan_reg.clone()
    steps = torch.diff(batch["gt_ego_fut_trajs"], dim=1, prepend=torch.zeros(1, 1, 2))
    exact[0, 0, 8] = steps[0]
    assert float(plan_losses(exact, plan_cls)["plan_reg"]) == pytest.approx(0.0, abs=1e-6)


def test_denoiser_builds_positive_and_negative_copies_per_group() -> None:
    from drivebench.models.sparsedrive.denoising import BoxDenoiser, denoising_attention_mask

    boxes = [torch.tensor([[10.0, 0.0, -1.0, 2.0, 4.0, 1.5, 0.0, 1.0, 0.0]]), torch.zeros(0, 9)]
    labels = [torch.tensor([3]), torch.zeros(0, dtype=torch.long)]
    q = BoxDenoiser(num_groups=3, num_classes=10)(labels, boxes, torch.device("cpu"))
    assert q.anchor.shape == (2, 3 * 2, 11) and q.group_size == 2 and q.num_valid == 6
    assert q.cls_target[0].tolist() == [3, 10] * 3 and (q.cls_target[1] == -1).all()
    target = encode_boxes(boxes[0][0])
    scale = torch.tensor([2.0] * 3 + [0.5] * 7)
    pos, neg = q.anchor[0, 0::2, :10], q.anchor[0, 1::2, :10]
    assert ((pos - target).abs() <= scale).all()
    assert ((neg - target).abs() >= scale).all() and ((neg - target).abs() <= 2 * scale).all()
    assert (q.box_weight[0, 1::2] == 0).all() and (q.box_weight[0, 0::2] == 1).all()
    mask = denoising_attention_mask(2, 4, 2, torch.device("cpu"))
    assert mask[:2, :2].all() and not mask[:2, 2:].any() and not mask[2:, :2].any()
    assert mask[2:4, 2:4].all() and not mask[2:4, 4:].any()
