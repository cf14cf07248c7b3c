"""Occupancy metrics as upstream's ``MeanIoU``: mIoU over the semantic classes and geometry IoU.

Accumulates a (C x C) confusion matrix on the device (``index_add_``: no host sync per batch); all
numbers are derived from it at the end. A torchmetrics ``Metric``: the matrix is a ``sum`` state, so
under DDP ``compute`` derives the numbers from every rank's voxels.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torchmetrics import Metric

SURROUNDOCC_CLASS_NAMES = (
    "others", "barrier", "bicycle", "bus", "car", "construction_vehicle", "motorcycle", "pedestrian",
    "traffic_cone", "trailer", "truck", "driveable_surface", "other_flat", "sidewalk", "terrain", "manmade",
    "vegetation", "empty",
)


class OccupancyMetric(Metric):
    """mIoU over ``semantic_classes`` (upstream: 1..16) and IoU of occupied (label != empty) vs empty.

    As upstream: only voxels of the mask count; a class never seen in the ground truth scores IoU 1;
    results are in percent.
    """

    full_state_update = False

    def __init__(self, num_classes: int = 18, semantic_classes: Sequence[int] = tuple(range(1, 17)),
                 empty_label: int = 17, class_names: Sequence[str] = SURROUNDOCC_CLASS_NAMES, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.num_classes = num_classes
        self.semantic_classes = tuple(semantic_classes)
        self.empty_label = empty_label
        self.class_names = tuple(class_names)
        self.add_state("confusion", default=torch.zeros(num_classes * num_classes, dtype=torch.long),
                       dist_reduce_fx="sum", persistent=False)

    def update(self, pred: torch.Tensor, target: torch.Tensor, mask: torch.Tensor | None = None) -> None:
        """Add predictions and labels of the same shape (integer classes); ``mask`` selects voxels."""
        if pred.shape != target.shape:
            raise ValueError(f"prediction shape {tuple(pred.shape)} != label shape {tuple(target.shape)}")
        c = self.num_classes
        valid = (target >= 0) & (target < c) & (pred >= 0) & (pred < c)
        if mask is not None:
            valid = valid & mask
        index = (target.clamp(0, c - 1) * c + pred.clamp(0, c - 1)).reshape(-1)
        self.confusion.index_add_(0, index, valid.reshape(-1).long())

    def confusion_matrix(self) -> torch.Tensor:
        """(C, C) counts, rows = ground truth, columns = prediction (inside ``compute`` under DDP: of
        every rank)."""
        return self.confusion.view(self.num_classes, self.num_classes)

    def compute(self) -> dict[str, float]:
        conf = self.confusion_matrix().double().cpu()
        seen, positive, correct = conf.sum(1), conf.sum(0), conf.diagonal()
        result: dict[str, float] = {}
        ious = []
        for c in self.semantic_classes:
            union = seen[c] + positive[c] - correct[c]
            iou = 1.0 if seen[c] == 0 else float(correct[c] / union)
            ious.append(iou)
            result[f"iou_{self.class_names[c] if c < len(self.class_names) else c}"] = 100.0 * iou
        occupied = torch.ones(self.num_classes, dtype=torch.bool)
        occupied[self.empty_label] = False
        geo_correct = conf[occupied][:, occupied].sum()
        geo_seen, geo_positive = conf[occupied].sum(), conf[:, occupied].sum()
        geo_union = geo_seen + geo_positive - geo_correct
        result["miou"] = 100.0 * sum(ious) / max(len(ious), 1)
        # what a reader needs beside upstream's mIoU: how many classes the ground truth has (the
        # others score 100), and the mean over those alone (see metric_notes)
        present = [iou for c, iou in zip(self.semantic_classes, ious) if seen[c] > 0]
        result["classes_present"] = float(len(present))
        result["miou_present"] = 100.0 * sum(present) / len(present) if present else 0.0
        result["iou"] = 100.0 * float(geo_correct / geo_union) if geo_union > 0 else 0.0
        return result


def metric_notes(values: dict[str, float], semantic_classes: int = 16) -> dict[str, str]:
    """Notes for the summary table beside ``miou``, when classes are absent from the ground truth
    (the embedded set has a few): upstream's MeanIoU scores each absent class 100, so the mIoU then
    says more about the data than the model."""
    present = values.get("classes_present")
    if present is None or present >= semantic_classes:
        return {}
    absent = semantic_classes - int(present)
    return {"miou": f"{int(present)} of {semantic_classes} classes in the ground truth: the {absent} absent score 100 "
                    f"as in upstream's MeanIoU; over the {int(present)} present: {values.get('miou_present', 0.0):.3g}"}
