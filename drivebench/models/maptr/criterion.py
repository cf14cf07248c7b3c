"""MapTR's training loss: Hungarian matching + focal classification + point L1 + edge direction,
on every decoder layer (auxiliary losses), as upstream ``MapTRHead.loss``.

Per layer (upstream weights): ``2.0 * focal`` over all queries and classes, ``5.0 * L1`` between
matched predictions and their best-ordered ground truth in normalised BEV coordinates, and
``0.005 * (1 - cos)`` between consecutive-point edge vectors in metres; each term is summed and
divided by the number of matched instances (averaged over data-parallel ranks, upstream's
``reduce_mean``). Keys: ``loss_cls`` / ``loss_pts`` / ``loss_dir`` for the last layer,
``d{i}.loss_*`` for the earlier ones, ``loss`` = their sum.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from drivebench.models.common.losses import sigmoid_focal_loss
from drivebench.models.common.map_matching import MapMatches, hungarian_match_map
from drivebench.models.maptr.geometry import PcRange, normalize_points


def _mean_over_ranks(x: torch.Tensor) -> torch.Tensor:
    """Average a tensor over data-parallel ranks (a collective, no host sync); identity when alone."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        x = x.clone()
        dist.all_reduce(x)
        x = x / dist.get_world_size()
    return x


class MapTRCriterion(nn.Module):
    """Args:
        pc_range: BEV extent used to normalise the ground truth (the model's).
        num_classes: map classes.
        cls_weight / pts_weight / dir_weight: loss weights (2.0 / 5.0 / 0.005 upstream).
        cls_cost_weight / pts_cost_weight: matching cost weights (2.0 / 5.0 upstream).
        dir_interval: edge step for the direction loss (1 upstream).
    """

    def __init__(self, pc_range: PcRange, num_classes: int = 3, cls_weight: float = 2.0, pts_weight: float = 5.0,
                 dir_weight: float = 0.005, cls_cost_weight: float = 2.0, pts_cost_weight: float = 5.0,
                 focal_alpha: float = 0.25, focal_gamma: float = 2.0, dir_interval: int = 1) -> None:
        super().__init__()
        self.pc_range = tuple(float(v) for v in pc_range)
        self.num_classes = num_classes
        self.cls_weight, self.pts_weight, self.dir_weight = cls_weight, pts_weight, dir_weight
        self.cls_cost_weight, self.pts_cost_weight = cls_cost_weight, pts_cost_weight
        self.focal_alpha, self.focal_gamma = focal_alpha, focal_gamma
        self.dir_interval = dir_interval

    def match(self, outputs: dict[str, torch.Tensor], gt_labels: Sequence[torch.Tensor],
              gt_pts: Sequence[torch.Tensor], gt_num_orderings: Sequence[torch.Tensor] | None) -> MapMatches:
        """Hungarian matching of every decoder layer (one host copy for all of them)."""
        gt_norm = [normalize_points(p, self.pc_range) for p in gt_pts]
        return hungarian_match_map(
            outputs["cls_logits"], outputs["pts_norm"], list(gt_labels), gt_norm,
            list(gt_num_orderings) if gt_num_orderings is not None else None,
            cls_weight=self.cls_cost_weight, pts_weight=self.pts_cost_weight,
            focal_alpha=self.focal_alpha, focal_gamma=self.focal_gamma,
        )

    def forward(self, outputs: dict[str, torch.Tensor], gt_labels: Sequence[torch.Tensor],
                gt_pts: Sequence[torch.Tensor], gt_num_orderings: Sequence[torch.Tensor] | None = None
                ) -> dict[str, torch.Tensor]:
        """
        Args:
            outputs: the model's ``cls_logits`` (L, B, V, C), ``pts_norm`` and ``pts`` (L, B, V, P, 2).
            gt_labels / gt_pts / gt_num_orderings: the batch's ``gt_map_*`` lists (metres).
        """
        cls_logits, pts_norm, pts = outputs["cls_logits"], outputs["pts_norm"], outputs["pts"]
        n_layers = cls_logits.shape[0]
        matches = self.match(outputs, gt_labels, gt_pts, gt_num_orderings)
        device = cls_logits.device

        # non_blocking: a host list -> device copy that does not wait for the stream
        num_pos = torch.tensor(matches.num_matched, dtype=torch.float32).to(device, non_blocking=True)
        avg_factor = _mean_over_ranks(num_pos).clamp(min=1.0)  # (L,)

        # classification: one-hot targets at the matched (layer, sample, query, class), zeros elsewhere
        targets = torch.zeros_like(cls_logits, dtype=torch.float32)
        if len(matches.gt_idx):
            gt_labels_all = torch.cat(list(gt_labels)).to(device)
            targets[matches.set_idx, matches.batch_idx, matches.query_idx, gt_labels_all[matches.gt_idx]] = 1.0
        focal = sigmoid_focal_loss(cls_logits.float(), targets, self.focal_alpha, self.focal_gamma, reduction="none")
        loss_cls = focal.flatten(1).sum(1) / avg_factor

        loss_pts = pts_norm.new_zeros(n_layers, dtype=torch.float32)
        loss_dir = pts_norm.new_zeros(n_layers, dtype=torch.float32)
        if len(matches.gt_idx):
            gt_all = torch.cat(list(gt_pts)).to(device).float()  # (G, S, P, 2) metres
            target = gt_all[matches.gt_idx, matches.ordering]  # (M, P, 2)
            target_norm = normalize_points(target, self.pc_range)
            sel = (matches.set_idx, matches.batch_idx, matches.query_idx)
            pred_norm = pts_norm[sel].float()
            l1 = (pred_norm - target_norm).abs().flatten(1).sum(1)
            loss_pts = loss_pts.index_add(0, matches.set_idx, l1)
            k = self.dir_interval
            pred_m = pts[sel].float()
            pred_dir = pred_m[:, k:] - pred_m[:, :-k]
            target_dir = target[:, k:] - target[:, :-k]
            cos = F.cosine_similarity(pred_dir, target_dir, dim=-1, eps=1e-8)
            loss_dir = loss_dir.index_add(0, matches.set_idx, (1.0 - cos).sum(1))
        # keep every regression output in the graph even without ground truth (DDP needs all grads)
        tie = pts_norm.sum().float() * 0.0
        loss_pts = (loss_pts + tie) / avg_factor
        loss_dir = loss_dir / avg_factor

        terms = {
            "loss_cls": torch.nan_to_num(self.cls_weight * loss_cls),
            "loss_pts": torch.nan_to_num(self.pts_weight * loss_pts),
            "loss_dir": torch.nan_to_num(self.dir_weight * loss_dir),
        }
        losses: dict[str, torch.Tensor] = {}
        for layer in range(n_layers):
            prefix = "" if layer == n_layers - 1 else f"d{layer}."
            for name, per_layer in terms.items():
                losses[prefix + name] = per_layer[layer]
        losses["loss"] = sum(per_layer.sum() for per_layer in terms.values())
        return losses
