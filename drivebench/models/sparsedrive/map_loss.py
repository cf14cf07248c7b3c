"""Losses of SparseDrive's online-map head, on points normalised to the map roi (upstream
``SparsePoint3DTarget`` + ``SparseLineLoss``).

Matching uses the shared ordered point-set matcher (``drivebench.models.common.map_matching``):
focal cost (1.0) + L1 over the closest equivalent ordering. Upstream's ``LinesL1Cost`` is a
smooth-L1 with beta 0.01 divided by the number of points and weighted 10.0; the shared matcher's
plain L1 sum weighted ``10 / num_points`` is the same cost up to the beta rounding (0.005 per
coordinate below 0.01 of the roi). The regression loss keeps upstream's smooth-L1 (beta 0.01).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from drivebench.models.common.losses import sigmoid_focal_loss
from drivebench.models.common.map_matching import hungarian_match_map


def normalise_points(points: torch.Tensor, roi: tuple[float, float]) -> torch.Tensor:
    """(..., 2) metres around the ego -> (0, 1) of the roi (x extent, y extent), as upstream."""
    x = (points[..., 0] + roi[0] / 2) / (roi[0] + 1e-5)
    y = (points[..., 1] + roi[1] / 2) / (roi[1] + 1e-5)
    return torch.stack([x, y], dim=-1)


def map_losses(
    classification: list[torch.Tensor],
    prediction: list[torch.Tensor],
    gt_labels: list[torch.Tensor],
    gt_pts: list[torch.Tensor],
    gt_num_orderings: list[torch.Tensor] | None,
    roi: tuple[float, float],
    num_sample: int,
    beta: float = 0.01,
    cls_threshold_to_reg: float = 0.05,
    cost_cls_weight: float = 1.0,
    cost_line_weight: float = 10.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(focal classification, smooth-L1 line) losses summed over decoder layers, per positive.

    The caller applies the loss weights (1.0 and 10.0 upstream).
    """
    from drivebench.models.sparsedrive.losses import positive_count

    cls_all = torch.stack(classification).float()  # (L, B, Q, C)
    n_layers, b, q, n_cls = cls_all.shape
    pts_all = normalise_points(torch.stack(prediction).float().view(n_layers, b, q, num_sample, 2), roi)
    device = cls_all.device
    gt_norm = [normalise_points(p.to(device).float(), roi) for p in gt_pts]
    labels = [lab.to(device).long() for lab in gt_labels]
    matches = hungarian_match_map(cls_all, pts_all, labels, gt_norm, gt_num_orderings,
                                  cls_weight=cost_cls_weight, pts_weight=cost_line_weight / num_sample)
    labels_all = torch.cat(labels) if labels else torch.zeros(0, dtype=torch.long, device=device)
    pts_cat = torch.cat(gt_norm) if gt_norm else torch.zeros(0, 1, num_sample, 2, device=device)

    cls_terms, line_terms = [], []
    start = 0
    for layer in range(n_layers):
        count = matches.num_matched[layer]
        sl = slice(start, start + count)  # matches are ordered by layer: host-side slicing, no sync
        start += count
        bi, qi, gi, oi = matches.batch_idx[sl], matches.query_idx[sl], matches.gt_idx[sl], matches.ordering[sl]
        num_pos = positive_count(count, device)
        cls_target = torch.full((b, q), n_cls, dtype=torch.long, device=device)
        cls_target[bi, qi] = labels_all[gi]
        line_target = torch.zeros(b, q, num_sample, 2, device=device)
        line_target[bi, qi] = pts_cat[gi, oi]
        one_hot = (cls_target[..., None] == torch.arange(n_cls, device=device)).float()  # background: zeros
        cls = cls_all[layer]
        cls_terms.append(sigmoid_focal_loss(cls.flatten(0, 1), one_hot.flatten(0, 1), reduction="sum") / num_pos)
        positive = cls_target < n_cls
        if cls_threshold_to_reg > 0:
            positive = positive & (cls.detach().max(-1).values.sigmoid() > cls_threshold_to_reg)
        err = F.smooth_l1_loss(pts_all[layer], line_target, beta=beta, reduction="none")
        line_terms.append((err * positive[..., None, None].float()).sum() / num_pos / num_sample)
    return torch.stack(cls_terms).sum(), torch.stack(line_terms).sum()
