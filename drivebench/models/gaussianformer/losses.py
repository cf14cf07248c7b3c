"""Occupancy losses of GaussianFormer: class-weighted cross-entropy + Lovasz-softmax, per supervised layer.

Lovasz-softmax follows Berman, Triki & Blaschko, "The Lovasz-Softmax loss" (CVPR 2018): for each class
c, sort the errors |[y = c] - p_c| in decreasing order and dot them with the gradient of the Lovasz
extension of the Jaccard loss at the sorted ground truth; average over the classes present.
Written without boolean indexing: ignored voxels are sorted last and contribute nothing, so there is
no host sync and shapes are fixed.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

# upstream's manual_class_weight (both paper configs), SurroundOcc classes 0..16 then empty (17)
SURROUNDOCC_CLASS_WEIGHTS = (
    1.01552756, 1.06897009, 1.30013094, 1.07253735, 0.94637502, 1.10087012, 1.26960524, 1.06258364, 1.189019,
    1.06217292, 1.00595144, 0.85706115, 1.03923299, 0.90867526, 0.8936431, 0.85486129, 0.8527829, 0.5,
)


def lovasz_grad(gt_sorted: torch.Tensor) -> torch.Tensor:
    """Gradient of the Lovasz extension of the Jaccard loss w.r.t. sorted errors (Berman et al., Alg. 1).

    ``gt_sorted``: (..., P) float 0/1 ground truth in the order of decreasing error.
    """
    gts = gt_sorted.sum(-1, keepdim=True)
    intersection = gts - gt_sorted.cumsum(-1)
    union = gts + (1.0 - gt_sorted).cumsum(-1)
    jaccard = 1.0 - intersection / union
    return torch.cat([jaccard[..., :1], jaccard[..., 1:] - jaccard[..., :-1]], dim=-1)


def lovasz_softmax(probs: torch.Tensor, labels: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """Multi-class Lovasz-softmax over classes present in the valid labels.

    Args:
        probs: (P, C) class probabilities.
        labels: (P,) integer classes (values outside [0, C) must be marked invalid).
        valid: optional (P,) bool; invalid entries are ignored.
    """
    num_classes = probs.shape[1]
    fg = F.one_hot(labels.clamp(0, num_classes - 1), num_classes).to(probs.dtype).t()  # (C, P)
    errors = (fg - probs.t()).abs()
    sort_key = errors.detach()
    if valid is not None:  # ignored entries: no foreground, zero error, sorted after every valid entry
        keep = valid.unsqueeze(0)
        fg = fg * keep
        errors = errors * keep
        sort_key = torch.where(keep, sort_key, torch.full_like(sort_key, -1.0))
    order = torch.argsort(sort_key, dim=1, descending=True)
    errors_sorted = errors.gather(1, order)
    fg_sorted = fg.gather(1, order)
    per_class = (errors_sorted * lovasz_grad(fg_sorted)).sum(-1)
    present = (fg.sum(-1) > 0).to(probs.dtype)
    return (per_class * present).sum() / present.sum().clamp(min=1.0)


def weighted_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, valid: torch.Tensor,
                           class_weights: torch.Tensor) -> torch.Tensor:
    """``nn.CrossEntropyLoss(weight=w)`` mean over valid voxels: sum w_y * ce / sum w_y."""
    num_classes = logits.shape[1]
    safe = labels.clamp(0, num_classes - 1)
    ce = F.cross_entropy(logits, safe, reduction="none")
    w = class_weights.to(logits.dtype)[safe] * valid.to(logits.dtype)
    return (ce * w).sum() / w.sum().clamp(min=torch.finfo(logits.dtype).tiny)


class OccupancyLoss(nn.Module):
    """Upstream ``OccupancyLoss`` of the paper configs: per layer ``ce_weight * CE + lovasz_weight * Lovasz``,
    averaged over the supervised layers.

    * CE uses the manual class weights normalised to sum to ``num_classes`` (as upstream) and the
      voxels of ``occ_mask``.
    * Lovasz-softmax runs on the softmax of the scores over the masked voxels except those labelled
      ``lovasz_ignore`` (upstream: the empty class 17), across the whole batch at once.
    """

    def __init__(
        self,
        num_classes: int = 18,
        class_weights: Sequence[float] | None = SURROUNDOCC_CLASS_WEIGHTS,
        ce_weight: float = 10.0,
        lovasz_weight: float = 1.0,
        lovasz_ignore: int | None = 17,
    ) -> None:
        super().__init__()
        if class_weights is None:
            weights = torch.ones(num_classes)
        else:
            if len(class_weights) != num_classes:
                raise ValueError(f"{len(class_weights)} class weights for num_classes={num_classes}")
            weights = torch.tensor(class_weights, dtype=torch.float32)
            weights = num_classes * weights / weights.sum()
        self.register_buffer("class_weights", weights, persistent=False)
        self.num_classes = num_classes
        self.ce_weight = ce_weight
        self.lovasz_weight = lovasz_weight
        self.lovasz_ignore = lovasz_ignore

    def forward(self, occ_logits: Sequence[torch.Tensor], labels: torch.Tensor,
                mask: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """``occ_logits``: per layer (B, C, X, Y, Z); ``labels`` (B, X, Y, Z) long; ``mask`` bool like labels."""
        if not occ_logits:
            raise ValueError("OccupancyLoss needs at least one layer of occupancy scores")
        valid = (labels >= 0) & (labels < self.num_classes)
        if mask is not None:
            valid = valid & mask
        lovasz_valid = valid if self.lovasz_ignore is None else valid & (labels != self.lovasz_ignore)
        flat_labels, flat_lovasz_valid = labels.reshape(-1), lovasz_valid.reshape(-1)
        ce_total = occ_logits[0].new_zeros(())
        lovasz_total = occ_logits[0].new_zeros(())
        for logits in occ_logits:
            logits = logits.float()
            if logits.shape[1] != self.num_classes or logits.shape[2:] != labels.shape[1:]:
                raise ValueError(f"occupancy scores {tuple(logits.shape)} do not match labels {tuple(labels.shape)} "
                                 f"with {self.num_classes} classes")
            ce_total = ce_total + weighted_cross_entropy(logits, labels, valid, self.class_weights)
            probs = logits.softmax(dim=1).movedim(1, -1).reshape(-1, self.num_classes)
            lovasz_total = lovasz_total + lovasz_softmax(probs, flat_labels, flat_lovasz_valid)
        n = len(occ_logits)
        loss_ce = self.ce_weight * ce_total / n
        loss_lovasz = self.lovasz_weight * lovasz_total / n
        return {"loss": loss_ce + loss_lovasz, "loss_ce": loss_ce, "loss_lovasz": loss_lovasz}
