"""Hungarian assignment of SparseDrive's detection queries to ground-truth boxes.

Costs follow upstream ``SparseBox3DTarget``: a focal classification cost (weight 2.0) plus a
weighted L1 box cost (weight 0.25) on the encoded state. Costs of every decoder layer and sample
are built on the device in one padded tensor, copied to the host once (the one sync point of the
detection loss) and solved with scipy; the assignments go back to the device in one copy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment

from drivebench.models.sparsedrive.boxes import REG_DIMS, encode_boxes


@dataclass
class PaddedTargets:
    """Ground truth of a batch padded to (B, G, ...) plus the concatenation used for scattering."""

    labels: torch.Tensor  # (B, G) long, -1 on padding
    boxes: torch.Tensor  # (B, G, 10) encoded, NaN replaced by 0
    weights: torch.Tensor  # (B, G, 10) per-instance regression weights (0 where the target was NaN)
    valid: torch.Tensor  # (B, G) bool
    counts: list[int]  # n_i per sample (from shapes: no sync)


def pad_box_targets(labels: list[torch.Tensor], boxes: list[torch.Tensor], class_reg_weights: dict[int, torch.Tensor],
                    device: torch.device) -> PaddedTargets:
    """Pad per-sample ground truth; ``class_reg_weights`` (class -> (10,) device tensor) replace the
    regression weights of that class (upstream: no yaw for traffic cones)."""
    counts = [int(x.shape[0]) for x in labels]
    b, g = len(labels), max(counts + [1])
    out_labels = torch.full((b, g), -1, dtype=torch.long, device=device)
    out_boxes = torch.zeros(b, g, REG_DIMS, device=device)
    out_weights = torch.zeros(b, g, REG_DIMS, device=device)
    for i, (lab, box) in enumerate(zip(labels, boxes)):
        n = counts[i]
        if n == 0:
            continue
        enc = encode_boxes(box.to(device).float())
        weight = (~torch.isnan(enc)).float()
        lab = lab.to(device).long()
        for cls, cls_weight in class_reg_weights.items():
            weight = torch.where((lab == cls)[:, None], cls_weight, weight)
        out_labels[i, :n] = lab
        out_boxes[i, :n] = torch.nan_to_num(enc, nan=0.0)
        out_weights[i, :n] = weight * (~torch.isnan(enc)).float()
    return PaddedTargets(out_labels, out_boxes, out_weights, out_labels >= 0, counts)


def focal_match_cost(cls_logits: torch.Tensor, labels: torch.Tensor, alpha: float = 0.25, gamma: float = 2.0,
                     eps: float = 1e-12) -> torch.Tensor:
    """(..., Q, C) logits, (..., G) labels -> (..., Q, G) focal cost of assigning query q to target g."""
    p = cls_logits.float().sigmoid()
    neg = -(1 - p + eps).log() * (1 - alpha) * p.pow(gamma)
    pos = -(p + eps).log() * alpha * (1 - p).pow(gamma)
    index = labels.clamp(min=0)[..., None, :].expand(*p.shape[:-1], labels.shape[-1])
    return torch.gather(pos - neg, -1, index)


def box_match_cost(pred: torch.Tensor, targets: PaddedTargets, dim_weights: list[float]) -> torch.Tensor:
    """(L, B, Q, >=10) states -> (L, B, Q, G) weighted L1 cost, one state dimension at a time
    (keeps the intermediate at (L, B, Q, G) instead of (L, B, Q, G, 10))."""
    cost = pred.new_zeros(*pred.shape[:-1], targets.boxes.shape[1], dtype=torch.float32)
    for d, dim_weight in enumerate(dim_weights[:REG_DIMS]):
        if dim_weight == 0.0:
            continue
        w = targets.weights[None, :, None, :, d] * dim_weight
        cost = cost + (pred[..., d, None].float() - targets.boxes[None, :, None, :, d]).abs() * w
    return cost


@dataclass
class HungarianResult:
    per_layer: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]  # (sample, query, target) per layer
    num_matched: list[int]  # per layer (host-known)


def hungarian_assign(costs: torch.Tensor, counts: list[int]) -> HungarianResult:
    """Solve (L, B, Q, G) padded cost matrices; sample b uses the first ``counts[b]`` columns.

    NaN / inf costs become 1e8 (upstream's guard), so a diverging prediction cannot break scipy.
    """
    device = costs.device
    costs = torch.nan_to_num(costs.detach().float(), nan=1e8, posinf=1e8, neginf=1e8)
    # SYNC POINT: one device->host copy of all cost matrices of the batch (scipy runs on the host)
    host = costs.cpu().numpy()
    n_layers = host.shape[0]
    rows: list[np.ndarray] = []
    sizes: list[int] = []
    for layer in range(n_layers):
        size = 0
        for b, n in enumerate(counts):
            if n == 0:
                continue
            q_idx, g_idx = linear_sum_assignment(host[layer, b, :, :n])
            rows.append(np.stack([np.full_like(q_idx, b), q_idx, g_idx], axis=0))
            size += len(q_idx)
        sizes.append(size)
    if rows:
        flat = torch.from_numpy(np.concatenate(rows, axis=1).astype(np.int64))
        if device.type == "cuda":
            flat = flat.pin_memory()
        flat = flat.to(device, non_blocking=True)  # one host->device copy
    else:
        flat = torch.zeros(3, 0, dtype=torch.long, device=device)
    per_layer = []
    start = 0
    for size in sizes:
        part = flat[:, start : start + size]
        per_layer.append((part[0], part[1], part[2]))
        start += size
    return HungarianResult(per_layer, sizes)
