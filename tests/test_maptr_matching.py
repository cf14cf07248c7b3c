"""Ordered point-set matching (drivebench.models.common.map_matching) and MapTR's loss."""

from __future__ import annotations

import numpy as np
import torch

from drivebench.models.common.map_matching import (
    focal_classification_cost,
    hungarian_match_map,
    ordered_points_l1_cost,
)
from drivebench.models.maptr.criterion import MapTRCriterion
from drivebench.models.maptr.geometry import denormalize_points, normalize_points
from drivebench.models.maptr.synthetic import polygon_orderings, polyline_orderings
from drivebench.polylines import resample

PC = (-15.0, -30.0, -2.0, 15.0, 30.0, 2.0)


def _polyline(start, end, n=20):
    return resample(np.array([start, end], dtype=np.float64), n)


def _ring(n=20):
    corners = np.array([[0.1, 0.1], [0.4, 0.1], [0.4, 0.3], [0.1, 0.3], [0.1, 0.1]])
    ring = resample(corners, n)
    ring[-1] = ring[0]
    return ring


def _logits(q, labels, c=3, strong=4.0):
    out = torch.full((q, c), -strong)
    for i, lbl in enumerate(labels):
        out[i, lbl] = strong
    return out


def test_reversed_polyline_is_matched_at_its_reverse_ordering():
    line, n_ord = polyline_orderings(_polyline([0.2, 0.2], [0.8, 0.6]).astype(np.float32), 19)
    gt = torch.from_numpy(line)[None]  # (1, 19, 20, 2); orderings beyond 2 are -10000 padding
    pred = torch.from_numpy(line[1].copy())[None, None, None]  # (L=1, B=1, Q=1, 20, 2): the reverse
    other = torch.rand(1, 1, 3, 20, 2)
    preds = torch.cat([other[:, :, :2], pred, other[:, :, 2:]], dim=2)  # the reverse sits at query 2
    logits = torch.zeros(1, 1, 4, 3)
    m = hungarian_match_map(logits, preds, [torch.tensor([0])], [gt], [torch.tensor([n_ord])])
    assert m.query_idx.tolist() == [2] and m.gt_idx.tolist() == [0]
    assert m.ordering.tolist() == [1]
    cost, order = ordered_points_l1_cost(preds[0, 0], gt, torch.tensor([n_ord]))
    assert float(cost[2, 0]) < 1e-5 and int(order[2, 0]) == 1


def test_shifted_polygon_is_matched_at_its_shift():
    rings, n_ord = polygon_orderings(_ring().astype(np.float32), 19)
    assert n_ord == 19
    gt = torch.from_numpy(rings)[None]
    pred = torch.from_numpy(rings[7].copy())[None, None, None]
    m = hungarian_match_map(torch.zeros(1, 1, 1, 3), pred, [torch.tensor([1])], [gt], [torch.tensor([19])])
    assert m.ordering.tolist() == [7]


def test_padded_orderings_are_never_chosen():
    line, _ = polyline_orderings(_polyline([0.1, 0.1], [0.9, 0.9]).astype(np.float32), 4)
    line[2:] = 0.5  # padding that happens to sit right on the prediction
    gt = torch.from_numpy(line)[None]
    pred = torch.full((1, 20, 2), 0.5)
    cost, order = ordered_points_l1_cost(pred, gt, torch.tensor([2]))
    assert int(order[0, 0]) in (0, 1) and float(cost[0, 0]) > 1.0
    _, order_unmasked = ordered_points_l1_cost(pred, gt)
    assert int(order_unmasked[0, 0]) >= 2  # the mask is what prevents it


def test_assignment_uses_class_and_points_over_several_layers_and_samples():
    torch.manual_seed(0)
    a = torch.from_numpy(polyline_orderings(_polyline([0.1, 0.2], [0.5, 0.2]).astype(np.float32), 2)[0])
    b = torch.from_numpy(polyline_orderings(_polyline([0.6, 0.7], [0.9, 0.4]).astype(np.float32), 2)[0])
    gts = [torch.stack([a, b]), torch.stack([b])]
    labels = [torch.tensor([0, 2]), torch.tensor([1])]
    # layer 0: sample 0 has b at query 0 (reversed), a at query 3; sample 1 has b at query 1
    preds = torch.rand(2, 2, 4, 20, 2)
    preds[:, 0, 0], preds[:, 0, 3], preds[:, 1, 1] = b[1], a[0], b[0]
    logits = torch.stack([torch.stack([_logits(4, [2, 1, 1, 0]), _logits(4, [0, 1, 0, 0])])] * 2)
    m = hungarian_match_map(logits, preds, labels, gts, [torch.tensor([2, 2]), torch.tensor([2])])
    assert m.num_matched == [3, 3]
    pairs = sorted(zip(m.set_idx.tolist(), m.batch_idx.tolist(), m.query_idx.tolist(), m.gt_idx.tolist(),
                       m.ordering.tolist()))
    # gt indices run over the concatenated ground truth: sample 1's element is index 2
    assert pairs == [(0, 0, 0, 1, 1), (0, 0, 3, 0, 0), (0, 1, 1, 2, 0),
                     (1, 0, 0, 1, 1), (1, 0, 3, 0, 0), (1, 1, 1, 2, 0)]


def test_nan_costs_do_not_crash_the_solver():
    gt = torch.from_numpy(polyline_orderings(_polyline([0.1, 0.1], [0.5, 0.5]).astype(np.float32), 2)[0])[None]
    preds = torch.rand(1, 1, 3, 20, 2)
    preds[0, 0, 0] = float("nan")
    logits = torch.zeros(1, 1, 3, 3)
    logits[0, 0, 1] = float("nan")
    m = hungarian_match_map(logits, preds, [torch.tensor([0])], [gt], [torch.tensor([2])])
    assert m.query_idx.tolist() == [2]


def test_samples_without_ground_truth_are_all_background():
    gt = torch.from_numpy(polyline_orderings(_polyline([0.1, 0.1], [0.5, 0.5]).astype(np.float32), 2)[0])[None]
    m = hungarian_match_map(torch.zeros(1, 2, 3, 3), torch.rand(1, 2, 3, 20, 2),
                            [torch.zeros(0, dtype=torch.long), torch.tensor([1])],
                            [torch.zeros(0, 2, 20, 2), gt], [torch.zeros(0, dtype=torch.long), torch.tensor([2])])
    assert m.batch_idx.tolist() == [1] and m.num_matched == [1]
    empty = hungarian_match_map(torch.zeros(1, 1, 3, 3), torch.rand(1, 1, 3, 20, 2),
                                [torch.zeros(0, dtype=torch.long)], [torch.zeros(0, 2, 20, 2)])
    assert empty.num_matched == [0] and empty.query_idx.numel() == 0


def test_focal_cost_prefers_the_confident_class():
    logits = torch.tensor([[4.0, -4.0, -4.0], [-4.0, 4.0, -4.0]])
    cost = focal_classification_cost(logits, torch.tensor([0, 1]))
    assert cost[0, 0] < cost[1, 0] and cost[1, 1] < cost[0, 1]


def _outputs_from_normalised(pts_norm, logits):
    return {"cls_logits": logits, "pts_norm": pts_norm, "pts": denormalize_points(pts_norm, PC)}


def test_loss_is_small_for_a_perfect_prediction_in_either_direction():
    crit = MapTRCriterion(PC)
    line_m = _polyline([-10.0, -20.0], [8.0, 15.0]).astype(np.float32)
    gt, n_ord = polyline_orderings(line_m, 19)
    gt_t = torch.from_numpy(gt)[None]
    reverse = normalize_points(torch.from_numpy(line_m[::-1].copy()), PC)
    pts = torch.rand(2, 1, 5, 20, 2)
    pts[:, 0, 3] = reverse
    logits = torch.full((2, 1, 5, 3), -8.0)
    logits[:, 0, 3, 2] = 8.0
    losses = crit(_outputs_from_normalised(pts, logits), [torch.tensor([2])], [gt_t], [torch.tensor([n_ord])])
    assert set(losses) == {"loss", "loss_cls", "loss_pts", "loss_dir", "d0.loss_cls", "d0.loss_pts", "d0.loss_dir"}
    assert float(losses["loss_pts"]) < 1e-4 and float(losses["loss_dir"]) < 1e-4
    assert float(losses["loss_cls"]) < 1e-3
    total = sum(v for k, v in losses.items() if k != "loss")
    torch.testing.assert_close(losses["loss"], total)
    # the same prediction, one point moved by 3 m in x: L1 of 3/30 normalised, times the weight 5
    pts_off = pts.clone()
    pts_off[:, 0, 3, 5, 0] += 0.1
    off = crit(_outputs_from_normalised(pts_off, logits), [torch.tensor([2])], [gt_t], [torch.tensor([n_ord])])
    torch.testing.assert_close(off["loss_pts"], torch.tensor(5 * 0.1), atol=1e-4, rtol=1e-4)
