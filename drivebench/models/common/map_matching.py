"""One-to-one matching of predicted map instances to ground-truth polylines / polygons.

Shared by MapTR and SparseDrive's map head. A ground-truth element comes with S equivalent point
orderings (a polyline forwards and backwards, a polygon from every start vertex); the point cost
of a (prediction, element) pair is the L1 distance to the *closest* ordering (upstream MapTR's
``OrderedPtsL1Cost`` followed by a min over orderings), and that ordering becomes the regression
target. The classification cost is mmdet's ``FocalLossCost``. Hungarian assignment runs in scipy on
the CPU, as upstream; costs for every prediction set (decoder layer) and sample are computed on the
device in one pass and copied to the host once per call.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment

# Finite stand-in for NaN / inf costs: scipy rejects non-finite entries ("cost matrix is
# infeasible" / "invalid numeric entries", hustvl/MapTR#88), so a diverging step would crash.
_BAD_COST = 1e8


def focal_classification_cost(logits: torch.Tensor, gt_labels: torch.Tensor, alpha: float = 0.25,
                              gamma: float = 2.0, eps: float = 1e-12) -> torch.Tensor:
    """Focal-loss matching cost (mmdet ``FocalLossCost``), (..., Q, C) x (G,) -> (..., Q, G)."""
    prob = logits.sigmoid()
    neg = -(1 - prob + eps).log() * (1 - alpha) * prob.pow(gamma)
    pos = -(prob + eps).log() * alpha * (1 - prob).pow(gamma)
    return (pos - neg)[..., gt_labels]


def ordered_points_l1_cost(pred_pts: torch.Tensor, gt_pts: torch.Tensor,
                           num_orderings: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """L1 distance from every prediction to every ground-truth element at its best ordering.

    Args:
        pred_pts: (..., Q, P, 2).
        gt_pts: (G, S, P, 2) every element in its S orderings (same coordinates as ``pred_pts``).
        num_orderings: optional long (G,): orderings beyond it are padding and never chosen.

    Returns:
        cost (..., Q, G) and the arg-min ordering (..., Q, G) (long).
    """
    g, s, p, _ = gt_pts.shape
    lead = pred_pts.shape[:-2]
    flat_pred = pred_pts.reshape(-1, p * 2)
    flat_gt = gt_pts.reshape(g * s, p * 2).to(flat_pred.dtype)
    cost = torch.cdist(flat_pred, flat_gt, p=1).view(*lead, g, s)
    if num_orderings is not None:
        padded = torch.arange(s, device=gt_pts.device)[None, :] >= num_orderings.to(gt_pts.device)[:, None]
        cost = cost.masked_fill(padded, float("inf"))
    best, order = cost.min(dim=-1)
    return best, order


@dataclass
class MapMatches:
    """Matched pairs, flat over (prediction set, sample). All tensors long, on the predictions' device.

    Attributes:
        set_idx: index of the prediction set (e.g. decoder layer) of each pair.
        batch_idx: sample of each pair.
        query_idx: matched prediction (instance query) within its sample.
        gt_idx: matched element, indexing the concatenation of all samples' ground truth.
        ordering: the element's ordering closest to the matched prediction (the regression target).
        num_matched: pairs per prediction set (host ints; no device sync to read).
    """

    set_idx: torch.Tensor
    batch_idx: torch.Tensor
    query_idx: torch.Tensor
    gt_idx: torch.Tensor
    ordering: torch.Tensor
    num_matched: list[int]


def hungarian_match_map(
    cls_logits: torch.Tensor,
    pred_pts: torch.Tensor,
    gt_labels: list[torch.Tensor],
    gt_pts: list[torch.Tensor],
    gt_num_orderings: list[torch.Tensor] | None = None,
    cls_weight: float = 2.0,
    pts_weight: float = 5.0,
    focal_alpha: float = 0.25,
    focal_gamma: float = 2.0,
) -> MapMatches:
    """Match every prediction set of a batch to the ground truth.

    Args:
        cls_logits: (L, B, Q, C) class logits of L prediction sets (decoder layers).
        pred_pts: (L, B, Q, P, 2) points, in the same (e.g. normalised) coordinates as ``gt_pts``.
        gt_labels: per sample, long (G_b,).
        gt_pts: per sample, (G_b, S, P, 2) ordered points.
        gt_num_orderings: per sample, long (G_b,) real orderings (None: all S are real).
        cls_weight / pts_weight: weights of the focal and ordered-L1 costs (MapTR: 2 and 5).

    Returns:
        ``MapMatches`` with, for every set and sample, min(Q, G_b) pairs.
    """
    n_sets, b, q = cls_logits.shape[:3]
    device = cls_logits.device
    if pred_pts.shape[:3] != (n_sets, b, q):
        raise ValueError(f"pred_pts leading shape {tuple(pred_pts.shape[:3])} != cls_logits' {(n_sets, b, q)}")
    if len(gt_labels) != b or len(gt_pts) != b:
        raise ValueError(f"{len(gt_labels)} label / {len(gt_pts)} point lists for a batch of {b}")
    sizes = [int(lbl.shape[0]) for lbl in gt_labels]
    total = sum(sizes)
    empty = torch.zeros(0, dtype=torch.long, device=device)
    if total == 0:
        return MapMatches(empty, empty, empty, empty, empty, [0] * n_sets)
    if pred_pts.shape[-2] != gt_pts[0].shape[-2]:
        raise ValueError(f"predictions have {pred_pts.shape[-2]} points per instance, ground truth "
                         f"{gt_pts[0].shape[-2]}; resample one of them to match")
    labels_all = torch.cat(gt_labels).to(device)
    pts_all = torch.cat(gt_pts).to(device)
    orderings_all = torch.cat(gt_num_orderings).to(device) if gt_num_orderings is not None else None

    with torch.no_grad():
        cls_cost = focal_classification_cost(cls_logits.detach().float(), labels_all, focal_alpha, focal_gamma)
        pts_cost, order = ordered_points_l1_cost(pred_pts.detach().float(), pts_all.float(), orderings_all)
        cost = cls_weight * cls_cost + pts_weight * pts_cost  # (L, B, Q, G_total)
        cost = torch.nan_to_num(cost, nan=_BAD_COST, posinf=_BAD_COST, neginf=-_BAD_COST)
    # Sync point: the one device -> host copy of the batch (scipy's Hungarian solver runs on the CPU).
    cost_np = cost.cpu().numpy()

    offsets = np.concatenate([[0], np.cumsum(sizes)])
    set_idx, batch_idx, query_idx, gt_idx = [], [], [], []
    num_matched = []
    for s in range(n_sets):
        count = 0
        for i in range(b):
            if sizes[i] == 0:
                continue
            block = cost_np[s, i, :, offsets[i]:offsets[i + 1]]
            rows, cols = linear_sum_assignment(block)
            set_idx.append(np.full(len(rows), s)), batch_idx.append(np.full(len(rows), i))
            query_idx.append(rows), gt_idx.append(cols + offsets[i])
            count += len(rows)
        num_matched.append(count)
    flat = np.stack([np.concatenate(a) for a in (set_idx, batch_idx, query_idx, gt_idx)]).astype(np.int64)
    flat_t = torch.from_numpy(flat).to(device, non_blocking=True)
    s_idx, b_idx, q_idx, g_idx = flat_t.unbind(0)
    return MapMatches(s_idx, b_idx, q_idx, g_idx, order[s_idx, b_idx, q_idx, g_idx], num_matched)
