"""Query denoising for the detection head (Sparse4D v3 style; off in ``sparsedrive_small``).

During training, noisy copies of the ground-truth boxes join the learned queries: per group, one
positive copy per box (uniform noise within ``noise_scale``) that must regress back to its box, and
one negative copy (noise between 1x and 2x the scale) that must be classified as background.
Groups see only themselves in self attention and the learned queries never see them.

Simplification (stated): upstream assigns noisy copies to boxes with a Hungarian match per group
(a host sync per sample); here copy i belongs to box i, positives regress and negatives are
background, which keeps denoising sync-free. Temporal denoising groups are not reproduced.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from drivebench.models.sparsedrive.boxes import REG_DIMS, STATE_DIMS, encode_boxes


@dataclass
class DenoisingQueries:
    anchor: torch.Tensor  # (B, N, 11) noisy anchor states, N = groups * (2 if negatives else 1) * G
    cls_target: torch.Tensor  # (B, N) class of positives, num_cls for negatives, -1 on padding
    box_target: torch.Tensor  # (B, N, 10) encoded box of positives (0 elsewhere)
    box_weight: torch.Tensor  # (B, N, 10) 1 on positive, non-NaN dimensions
    num_valid: int  # valid (non-padding) noisy queries in the batch, host-known
    group_size: int  # queries per group


@dataclass
class DenoisingOutput:
    classification: list[torch.Tensor]  # per layer (B, N, C)
    prediction: list[torch.Tensor]  # per layer (B, N, 11)
    queries: DenoisingQueries


class BoxDenoiser:
    """Builds the noisy queries of one batch (no parameters)."""

    def __init__(self, num_groups: int, num_classes: int, noise_scale: tuple[float, ...] = (2.0,) * 3 + (0.5,) * 7,
                 max_gt: int = 32, add_negatives: bool = True) -> None:
        if num_groups < 1:
            raise ValueError(f"num_groups={num_groups}: denoising needs at least one group")
        self.num_groups, self.num_classes = num_groups, num_classes
        self.noise_scale = tuple(noise_scale)
        self.max_gt, self.add_negatives = max_gt, add_negatives

    def __call__(self, labels: list[torch.Tensor], boxes: list[torch.Tensor], device: torch.device) -> DenoisingQueries | None:
        counts = [min(int(x.shape[0]), self.max_gt) for x in labels]
        g = max(counts) if counts else 0
        if g == 0:
            return None
        b = len(labels)
        cls = torch.full((b, g), -1, dtype=torch.long, device=device)
        target = torch.zeros(b, g, REG_DIMS, device=device)
        weight = torch.zeros(b, g, REG_DIMS, device=device)
        for i, n in enumerate(counts):
            if n == 0:
                continue
            enc = encode_boxes(boxes[i][:n].to(device).float())
            cls[i, :n] = labels[i][:n].to(device).long()
            target[i, :n] = torch.nan_to_num(enc, nan=0.0)
            weight[i, :n] = (~torch.isnan(enc)).float()
        scale = torch.stack([torch.full((), s, device=device) for s in self.noise_scale])
        kinds = 2 if self.add_negatives else 1
        groups = []
        for _ in range(self.num_groups):
            pos = target + (torch.rand_like(target) * 2 - 1) * scale
            parts = [pos]
            if self.add_negatives:
                sign = torch.where(torch.rand_like(target) > 0.5, 1.0, -1.0)
                parts.append(target + (torch.rand_like(target) + 1) * sign * scale)
            groups.append(torch.cat(parts, dim=1))
        anchor = torch.cat(groups, dim=1)
        anchor = torch.cat([anchor, anchor.new_zeros(*anchor.shape[:-1], STATE_DIMS - REG_DIMS)], dim=-1)
        neg_cls = torch.where(cls >= 0, torch.full_like(cls, self.num_classes), cls)
        one = torch.cat([cls, neg_cls], dim=1) if self.add_negatives else cls
        zero = torch.zeros_like(target)
        one_target = torch.cat([target, zero], dim=1) if self.add_negatives else target
        one_weight = torch.cat([weight, zero], dim=1) if self.add_negatives else weight
        return DenoisingQueries(
            anchor=anchor,
            cls_target=one.repeat(1, self.num_groups),
            box_target=one_target.repeat(1, self.num_groups, 1),
            box_weight=one_weight.repeat(1, self.num_groups, 1),
            num_valid=self.num_groups * kinds * sum(counts),
            group_size=kinds * g,
        )


def denoising_attention_mask(num_queries: int, num_dn: int, group_size: int, device: torch.device) -> torch.Tensor:
    """(Q + N, Q + N) bool, True = may attend: learned queries among themselves, each noisy group
    within itself."""
    total = num_queries + num_dn
    group = torch.full((total,), -1, dtype=torch.long, device=device)
    group[num_queries:] = torch.arange(num_dn, device=device) // group_size
    return group[:, None] == group[None, :]
