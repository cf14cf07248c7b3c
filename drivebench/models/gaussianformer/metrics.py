"""Occupancy metrics as upstream's ``MeanIoU``: mIoU over the semantic classes and geometry IoU.

Accumulates a (C x C) confusion matrix on the device (``index_add_``: no host sync per batch); all
numbers are derived from it at the end.
"""

from __future__ import annotations

from typing import Sequence

import torch

SURROUNDOCC_CLASS_NAMES = (
    "others", "barrier", "bicycle", "bus", "car", "construction_vehicle", "motorcycle", "pedestrian",
    "traffic_cone", "trailer", "truck", "driveable_surface", "other_flat", "sidewalk", "terrain", "manmade",
    "vegetation", "empty",
)


class OccupancyMetric:
    """mIoU over ``semantic_classes`` (upstream: 1..16) and IoU of occupied (label != empty) vs empty.

    As upstream: only voxels of the mask count; a class never seen in the ground truth scores IoU 1;
    results are in percent.
    """

    def __init__(self, num_classes: int = 18, semantic_classes: Sequence[int] = tuple(range(1, 17)),
                 empty_label: int = 17, class_names: Sequence[str] = SURROUNDOCC_CLASS_NAMES) -> None:
        self.num_classes = num_classes
        self.semantic_classes = tuple(semantic_classes)
        self.empty_label = empty_label
        self.class_names = tuple(class_names)
        self.confusion: torch.Tensor | None = None

    def reset(self) -> None:
        self.confusion = None

    @torch.no_grad()
    def update(self, pred: torch.Tensor, target: torch.Tensor, mask: torch.Tensor | None = None) -> None:
        """Add predictions and labels of the same shape (integer classes); ``mask`` selects voxels."""
        if pred.shape != target.shape:
            raise ValueError(f"prediction shape {tuple(pred.shape)} != label shape {tuple(target.shape)}")
        c = self.num_classes
        if self.confusion is None:
            self.confusion = torch.zeros(c * c, dtype=torch.long, device=target.device)
        valid = (target >= 0) & (target < c) & (pred >= 0) & (pred < c)
        if mask is not None:
            valid = valid & mask
        index = (target.clamp(0, c - 1) * c + pred.clamp(0, c - 1)).reshape(-1)
        self.confusion.index_add_(0, index, valid.reshape(-1).long())

    def confusion_matrix(self) -> torch.Tensor:
        """(C, C) counts, rows = ground truth, columns = prediction (under DDP, after :meth:`merge`:
        of every rank)."""
        conf = self.confusion if self.confusion is not None else torch.zeros(self.num_classes ** 2, dtype=torch.long)
        return conf.view(self.num_classes, self.num_classes)

    def state(self) -> torch.Tensor | None:
        """The confusion counts on the host (None before any update), for :meth:`merge`."""
        return None if self.confusion is None else self.confusion.detach().cpu()

    def merge(self, states) -> None:
        """Become the union of ``states`` (every rank's): the summed confusion matrix."""
        present = [s for s in states if s is not None]
        self.confusion = torch.stack(present).sum(0) if present else None

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
        result["iou"] = 100.0 * float(geo_correct / geo_union) if geo_union > 0 else 0.0
        return result
