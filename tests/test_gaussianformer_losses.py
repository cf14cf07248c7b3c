"""Occupancy loss (Lovasz-softmax, weighted CE) and mIoU/IoU on hand-made cases."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from drivebench.models.gaussianformer.losses import (
    SURROUNDOCC_CLASS_WEIGHTS, OccupancyLoss, lovasz_grad, lovasz_softmax, weighted_cross_entropy,
)
from drivebench.models.gaussianformer.metrics import OccupancyMetric


def _soft_jaccard_loss_by_definition(errors: torch.Tensor, fg: torch.Tensor) -> float:
    """Lovasz extension of the Jaccard loss, evaluated by its definition: sum over thresholds of the set
    function Delta_J at the level sets, weighted by the gaps between sorted errors (Berman et al., Eq. 8)."""
    order = torch.argsort(errors, descending=True)
    e = errors[order].tolist() + [0.0]
    gt = fg[order].bool()
    total = 0.0
    for i in range(len(order)):
        mistakes = torch.zeros_like(gt)
        mistakes[: i + 1] = True  # the i+1 largest errors are counted as mispredictions
        false_neg = (gt & mistakes).sum().item()
        false_pos = (~gt & mistakes).sum().item()
        gts = gt.sum().item()
        delta_j = (false_neg + false_pos) / (gts + false_pos)
        total += delta_j * (e[i] - e[i + 1])
    return total


def test_lovasz_grad_small_case():
    # gts = 2; sorted gt [1, 0, 1]: jaccard after each prefix = 1/2, 2/3, 1
    grad = lovasz_grad(torch.tensor([1.0, 0.0, 1.0]))
    torch.testing.assert_close(grad, torch.tensor([0.5, 2 / 3 - 0.5, 1 - 2 / 3]))


def test_lovasz_softmax_equals_lovasz_extension_definition():
    probs = torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.6, 0.3], [0.5, 0.4, 0.1], [0.2, 0.2, 0.6], [0.3, 0.3, 0.4]])
    labels = torch.tensor([0, 1, 1, 2, 0])
    expected = []
    for c in range(3):
        fg = (labels == c).float()
        expected.append(_soft_jaccard_loss_by_definition((fg - probs[:, c]).abs(), fg))
    got = lovasz_softmax(probs, labels)
    torch.testing.assert_close(got, torch.tensor(sum(expected) / 3))


def test_lovasz_softmax_perfect_and_ignored_and_absent_classes():
    labels = torch.tensor([0, 0, 2, 2, 1])
    perfect = F.one_hot(labels, 4).float()
    assert lovasz_softmax(perfect, labels).item() == pytest.approx(0.0)
    # the ignored entry is wildly wrong but must not matter; class 3 never appears -> not averaged
    probs = perfect.clone()
    probs[4] = torch.tensor([0.0, 0.0, 0.0, 1.0])
    valid = torch.tensor([True, True, True, True, False])
    assert lovasz_softmax(probs, labels, valid).item() == pytest.approx(0.0)
    assert lovasz_softmax(probs, labels).item() > 0.1
    # equal to dropping the ignored entries
    noisy = torch.rand(5, 4).softmax(-1)
    torch.testing.assert_close(lovasz_softmax(noisy, labels, valid), lovasz_softmax(noisy[:4], labels[:4]))
    # no valid entry at all: zero, and still differentiable
    noisy.requires_grad_()
    zero = lovasz_softmax(noisy, labels, torch.zeros(5, dtype=torch.bool))
    zero.backward()
    assert zero.item() == 0.0 and torch.all(noisy.grad == 0)


def test_weighted_cross_entropy_matches_torch_with_mask():
    logits = torch.randn(2, 4, 3, 3, 2)
    labels = torch.randint(0, 4, (2, 3, 3, 2))
    valid = torch.rand(2, 3, 3, 2) > 0.3
    w = torch.tensor([1.0, 2.0, 0.5, 3.0])
    ref = F.cross_entropy(logits.movedim(1, -1)[valid], labels[valid], weight=w)
    torch.testing.assert_close(weighted_cross_entropy(logits, labels, valid, w), ref)


def test_occupancy_loss_terms_and_layer_average():
    crit = OccupancyLoss(num_classes=18)
    assert crit.class_weights.sum().item() == pytest.approx(18.0)
    assert crit.class_weights[17] / crit.class_weights[0] == pytest.approx(0.5 / SURROUNDOCC_CLASS_WEIGHTS[0])
    labels = torch.randint(0, 18, (2, 4, 4, 2))
    mask = torch.ones_like(labels, dtype=torch.bool)
    a, b = torch.randn(2, 18, 4, 4, 2), torch.randn(2, 18, 4, 4, 2)
    one = crit([a], labels, mask)
    two = crit([a, b], labels, mask)
    other = crit([b], labels, mask)
    assert set(one) == {"loss", "loss_ce", "loss_lovasz"}
    torch.testing.assert_close(one["loss"], one["loss_ce"] + one["loss_lovasz"])
    torch.testing.assert_close(two["loss"], (one["loss"] + other["loss"]) / 2)
    torch.testing.assert_close(one["loss_ce"], 10.0 * F.cross_entropy(a, labels, weight=crit.class_weights))
    # Lovasz ignores the empty class: flipping only empty-labelled voxels' scores leaves it unchanged
    labels_empty = labels.clone()
    labels_empty[:, :2] = 17
    changed = a.clone()
    changed[:, :, :2] = torch.randn_like(changed[:, :, :2])
    torch.testing.assert_close(crit([a], labels_empty, mask)["loss_lovasz"],
                               crit([changed], labels_empty, mask)["loss_lovasz"])
    # masked-out voxels do not count at all
    mask2 = mask.clone()
    mask2[:, :2] = False
    torch.testing.assert_close(crit([a], labels, mask2)["loss"], crit([changed], labels, mask2)["loss"])


def test_miou_and_geometry_iou_hand_made():
    metric = OccupancyMetric(num_classes=4, semantic_classes=(1, 2), empty_label=3, class_names=("o", "a", "b", "e"))
    target = torch.tensor([1, 1, 2, 3, 3, 0, 2])
    pred = torch.tensor([1, 2, 2, 3, 1, 0, 3])
    metric.update(pred[:4], target[:4])
    metric.update(pred[4:], target[4:])
    res = metric.compute()
    # class 1: tp 1 (idx 0), fn 1 (idx 1), fp 1 (idx 4) -> 1/3; class 2: tp 1 (idx 2), fn 1 (idx 6), fp 1 (idx 1) -> 1/3
    assert res["iou_a"] == pytest.approx(100 / 3) and res["iou_b"] == pytest.approx(100 / 3)
    assert res["miou"] == pytest.approx(100 / 3)
    # occupied = label != 3: target occupied {0,1,2,5,6}; predicted occupied {0,1,2,4,5}; both {0,1,2,5}
    assert res["iou"] == pytest.approx(100 * 4 / 6)


def test_metric_mask_unseen_class_and_reset():
    metric = OccupancyMetric(num_classes=4, semantic_classes=(1, 2), empty_label=3, class_names=("o", "a", "b", "e"))
    target = torch.tensor([[1, 3], [3, 1]])
    pred = torch.tensor([[1, 3], [1, 2]])
    metric.update(pred, target, mask=torch.tensor([[True, True], [True, False]]))
    res = metric.compute()
    assert res["iou_a"] == pytest.approx(50.0)  # tp 1, fp 1 (masked-in), the masked fn does not count
    assert res["iou_b"] == pytest.approx(100.0)  # never in the ground truth: IoU 1, as upstream
    metric.reset()
    metric.update(target, target)
    assert metric.compute()["miou"] == pytest.approx(100.0)


def test_metric_confusion_matrix_counts_every_pair():
    metric = OccupancyMetric(num_classes=3, semantic_classes=(0, 1), empty_label=2, class_names=("a", "b", "e"))
    pairs = list(itertools.product(range(3), range(3)))
    target = torch.tensor([t for t, _ in pairs])
    pred = torch.tensor([p for _, p in pairs])
    metric.update(pred, target)
    assert torch.equal(metric.confusion_matrix(), torch.ones(3, 3, dtype=torch.long))
