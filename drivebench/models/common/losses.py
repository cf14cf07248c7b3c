"""Loss functions shared by the camera models."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def sigmoid_focal_loss(
    logits: torch.Tensor,
    targets: torch.Tensor,
    alpha: float = 0.25,
    gamma: float = 2.0,
    weight: torch.Tensor | None = None,
    reduction: str = "sum",
) -> torch.Tensor:
    """Focal loss (Lin et al. 2017) on sigmoid logits; ``targets`` are one-hot floats of the same shape.

    The same arithmetic as mmdet's pure-PyTorch ``py_sigmoid_focal_loss``: no compiled op needed.
    """
    p = torch.sigmoid(logits)
    ce = F.binary_cross_entropy_with_logits(logits, targets, reduction="none")
    p_t = p * targets + (1 - p) * (1 - targets)
    loss = ce * (1 - p_t).pow(gamma)
    if alpha >= 0:
        loss = loss * (alpha * targets + (1 - alpha) * (1 - targets))
    if weight is not None:
        loss = loss * weight
    if reduction == "sum":
        return loss.sum()
    if reduction == "mean":
        return loss.mean()
    return loss
