"""SparseDrive's training losses (upstream ``sparsedrive_small`` weights).

- detection, every decoder layer: focal classification (2.0) + weighted L1 on the box state
  (0.25) + centerness (BCE) and yawness (Gaussian focal), Hungarian-matched (``targets``);
- map, every decoder layer: focal (1.0) + smooth-L1 ``LinesL1`` on normalised points (10.0),
  matched over the equivalent orderings of each element (``drivebench.models.common.map_matching``);
- motion: winner-take-all (mode with the smallest masked ADE) focal (0.2) + L1 on cumulative
  positions (0.2), on the queries matched to a box by the last detection layer;
- planning: the mode set of the given driving command, winner-take-all focal (0.5) + L1 (1.0),
  plus an L1 on the predicted ego status (1.0);
- auxiliary dense depth: L1 (0.2).

Per-positive averages divide by the number of matches, averaged over DDP ranks (as mmdet's
``reduce_mean``). Everything except the Hungarian host copy is free of host syncs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

import torch
import torch.distributed as dist
import torch.nn.functional as F

from drivebench.models.common.losses import sigmoid_focal_loss
from drivebench.models.sparsedrive.blocks import depth_loss
from drivebench.models.sparsedrive.boxes import COS_YAW, CNS, REG_DIMS, SIN_YAW, X, YNS, Z
from drivebench.models.sparsedrive.targets import (
    HungarianResult,
    PaddedTargets,
    box_match_cost,
    focal_match_cost,
    hungarian_assign,
    pad_box_targets,
)

if TYPE_CHECKING:
    from drivebench.models.sparsedrive.model import SparseDrive, SparseDriveOutput

TRAFFIC_CONE, BARRIER = 9, 5


def positive_count(count: int, device: torch.device) -> torch.Tensor | float:
    """max(mean over ranks of ``count``, 1): a Python float on one process (no device copy), a
    device scalar after an all-reduce under DDP."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        t = torch.full((), float(count), device=device)
        dist.all_reduce(t)
        return (t / dist.get_world_size()).clamp(min=1.0)
    return max(float(count), 1.0)


def gaussian_focal_loss(pred: torch.Tensor, target: torch.Tensor, alpha: float = 2.0, gamma: float = 4.0,
                        eps: float = 1e-12) -> torch.Tensor:
    """Element-wise Gaussian focal loss (CornerNet) on probabilities, as mmdet's."""
    pos = -(pred + eps).log() * (1 - pred).pow(alpha) * target.eq(1).to(pred.dtype)
    neg = -(1 - pred + eps).log() * pred.pow(alpha) * (1 - target).pow(gamma)
    return pos + neg


def _one_hot(labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """One-hot over ``num_classes``; labels outside [0, num_classes) (background) give all zeros.

    A comparison rather than ``F.one_hot``, whose range check may read the labels on the host.
    """
    return (labels[..., None] == torch.arange(num_classes, device=labels.device)).float()


def winner_take_all(pred_cum: torch.Tensor, target_cum: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Index of the mode with the smallest masked mean displacement: (..., M, T, 2), (..., T, 2), (..., T)."""
    dist_ = torch.linalg.norm(target_cum.unsqueeze(-3) - pred_cum, dim=-1) * mask.unsqueeze(-2)
    return dist_.mean(dim=-1).argmin(dim=-1)


class SparseDriveCriterion:
    """Computes every SparseDrive loss term from a batch and the model's output (no parameters)."""

    def __init__(
        self,
        model: "SparseDrive",
        det_cls_weight: float = 2.0,
        det_box_weight: float = 0.25,
        det_reg_weights: tuple[float, ...] = (2.0, 2.0, 2.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0),
        det_cost_cls_weight: float = 2.0,
        det_cost_box_weight: float = 0.25,
        det_cost_reg_weights: tuple[float, ...] = (2.0, 2.0, 2.0, 0.5, 0.5, 0.5, 0.0, 0.0, 0.0, 0.0),
        cls_threshold_to_reg: float = 0.05,
        class_reg_weights: Mapping[int, tuple[float, ...]] | None = None,
        yaw_reversible_classes: tuple[int, ...] = (BARRIER,),
        map_cls_weight: float = 1.0,
        map_line_weight: float = 10.0,
        map_line_beta: float = 0.01,
        motion_cls_weight: float = 0.2,
        motion_reg_weight: float = 0.2,
        plan_cls_weight: float = 0.5,
        plan_reg_weight: float = 1.0,
        plan_status_weight: float = 1.0,
        depth_weight: float = 0.2,
    ) -> None:
        self.num_det_classes = model.det_head.refine[0].cls_layers[-1].out_features
        self.num_map_classes = model.map_head.refine[0].cls_layers[-1].out_features
        self.map_roi = model.map_roi
        self.num_map_sample = model.num_map_sample
        self.det_cls_weight, self.det_box_weight = det_cls_weight, det_box_weight
        self.det_reg_weights = list(det_reg_weights)
        self.det_cost_cls_weight, self.det_cost_box_weight = det_cost_cls_weight, det_cost_box_weight
        self.det_cost_reg_weights = list(det_cost_reg_weights)
        self.cls_threshold_to_reg = cls_threshold_to_reg
        if class_reg_weights is None:  # upstream: traffic cones have no yaw to learn
            class_reg_weights = {TRAFFIC_CONE: (2.0, 2.0, 2.0, 1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0)}
        self.class_reg_weights = {int(k): list(v) for k, v in class_reg_weights.items()}
        self.yaw_reversible_classes = tuple(yaw_reversible_classes)
        self.map_cls_weight, self.map_line_weight, self.map_line_beta = map_cls_weight, map_line_weight, map_line_beta
        self.motion_cls_weight, self.motion_reg_weight = motion_cls_weight, motion_reg_weight
        self.plan_cls_weight, self.plan_reg_weight, self.plan_status_weight = plan_cls_weight, plan_reg_weight, plan_status_weight
        self.depth_weight = depth_weight
        self.last_det_assignment: HungarianResult | None = None
        self._consts: dict[tuple[str, torch.device], torch.Tensor] = {}

    def const(self, name: str, values: Any, device: torch.device, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """A constant tensor, copied to ``device`` once (a pageable host->device copy would wait on the stream)."""
        key = (name, device)
        if key not in self._consts:
            self._consts[key] = torch.as_tensor(values, dtype=dtype).to(device)
        return self._consts[key]

    def __call__(self, batch: Mapping[str, Any], out: "SparseDriveOutput") -> dict[str, torch.Tensor]:
        losses: dict[str, torch.Tensor] = {}
        det_targets, assignment = self.detection(batch, out, losses)
        if out.map is not None:
            self.map(batch, out, losses)
        if out.motion is not None:
            self.motion(batch, out, det_targets, assignment, losses)
            self.planning(batch, out, losses)
        if out.depth:
            if "gt_depth" not in batch:
                raise KeyError("SparseDrive's depth head needs batch['gt_depth'] (or build the model with num_depth_layers=0)")
            losses["depth"] = self.depth_weight * depth_loss(out.depth, list(batch["gt_depth"])[: len(out.depth)])
        losses["loss"] = torch.stack([v for v in losses.values()]).sum()
        return losses

    # ---- detection ---------------------------------------------------------------------------
    def detection(self, batch: Mapping[str, Any], out: "SparseDriveOutput",
                  losses: dict[str, torch.Tensor]) -> tuple[PaddedTargets, HungarianResult]:
        cls_all = torch.stack(out.det.classification)  # (L, B, Q, C)
        pred_all = torch.stack(out.det.prediction)  # (L, B, Q, 11)
        device = cls_all.device
        class_weights = {c: self.const(f"class_reg_{c}", w, device) for c, w in self.class_reg_weights.items()}
        targets = pad_box_targets(list(batch["gt_labels_3d"]), list(batch["gt_boxes_3d"]), class_weights, device)
        cost = self.det_cost_cls_weight * focal_match_cost(cls_all, targets.labels[None].expand(cls_all.shape[0], -1, -1))
        cost = cost + self.det_cost_box_weight * box_match_cost(pred_all, targets, self.det_cost_reg_weights)
        assignment = hungarian_assign(cost, targets.counts)
        self.last_det_assignment = assignment

        n_layers, b, q, n_cls = cls_all.shape
        reg_dim_weights = self.const("det_reg_weights", self.det_reg_weights, device)
        terms: dict[str, list[torch.Tensor]] = {"det_cls": [], "det_box": [], "det_cns": [], "det_yns": []}
        for layer in range(n_layers):
            sample, query, target = assignment.per_layer[layer]
            num_pos = positive_count(assignment.num_matched[layer], device)
            cls_target = torch.full((b, q), n_cls, dtype=torch.long, device=device)
            cls_target[sample, query] = targets.labels[sample, target]
            box_target = torch.zeros(b, q, REG_DIMS, device=device)
            box_target[sample, query] = targets.boxes[sample, target]
            reg_weight = torch.zeros(b, q, REG_DIMS, device=device)
            reg_weight[sample, query] = targets.weights[sample, target]

            cls = cls_all[layer].float()
            cls_loss = sigmoid_focal_loss(cls.flatten(0, 1), _one_hot(cls_target.flatten(), n_cls), reduction="sum")
            terms["det_cls"].append(self.det_cls_weight * cls_loss / num_pos)

            positive = cls_target < n_cls
            if self.cls_threshold_to_reg > 0:  # upstream: skip box loss of near-zero-score matches
                positive = positive & (cls.detach().max(-1).values.sigmoid() > self.cls_threshold_to_reg)
            pos_w = positive.float()
            pred = pred_all[layer][..., :REG_DIMS].float()
            box_target = self._reverse_yaw_where_allowed(box_target, pred, cls_target)
            box_loss = ((pred - box_target).abs() * reg_weight * reg_dim_weights * pos_w[..., None]).sum()
            terms["det_box"].append(self.det_box_weight * box_loss / num_pos)

            quality = out.det.quality[layer]
            if quality is not None:
                quality = quality.float()
                centre_err = torch.linalg.norm(box_target[..., X : Z + 1] - pred[..., X : Z + 1].detach(), dim=-1)
                cns_target = torch.exp(-centre_err)
                cns = F.binary_cross_entropy_with_logits(quality[..., CNS], cns_target, reduction="none")
                terms["det_cns"].append((cns * pos_w).sum() / num_pos)
                same_dir = F.cosine_similarity(box_target[..., SIN_YAW : COS_YAW + 1], pred[..., SIN_YAW : COS_YAW + 1], dim=-1) > 0
                yns = gaussian_focal_loss(quality[..., YNS].sigmoid(), same_dir.float())
                terms["det_yns"].append((yns * pos_w).sum() / num_pos)
        for name, values in terms.items():
            if values:
                losses[name] = torch.stack(values).sum()
        if out.det.dn is not None:
            self.denoising(out, reg_dim_weights, losses)
        return targets, assignment

    def denoising(self, out: "SparseDriveOutput", reg_dim_weights: torch.Tensor, losses: dict[str, torch.Tensor]) -> None:
        """Noisy queries: focal classification (positives -> their class, negatives -> background)
        and box L1 of the positives, per valid noisy query, with the detection weights."""
        assert out.det.dn is not None
        dn = out.det.dn
        q = dn.queries
        num_valid = positive_count(q.num_valid, q.anchor.device)
        valid = (q.cls_target >= 0).float()
        n_cls = dn.classification[0].shape[-1]
        one_hot = _one_hot(q.cls_target.clamp(min=0), n_cls)
        cls_terms, box_terms = [], []
        for cls, pred in zip(dn.classification, dn.prediction):
            cls_loss = sigmoid_focal_loss(cls.float().flatten(0, 1), one_hot.flatten(0, 1), weight=valid.flatten()[:, None],
                                          reduction="sum")
            cls_terms.append(self.det_cls_weight * cls_loss / num_valid)
            err = (pred[..., :REG_DIMS].float() - q.box_target).abs() * q.box_weight * reg_dim_weights
            box_terms.append(self.det_box_weight * err.sum() / num_valid)
        losses["det_dn_cls"] = torch.stack(cls_terms).sum()
        losses["det_dn_box"] = torch.stack(box_terms).sum()

    def _reverse_yaw_where_allowed(self, box_target: torch.Tensor, pred: torch.Tensor, cls_target: torch.Tensor) -> torch.Tensor:
        """Barriers have no front: flip the target heading when it is closer to the prediction reversed."""
        if not self.yaw_reversible_classes:
            return box_target
        yaw_t = box_target[..., SIN_YAW : COS_YAW + 1]
        opposite = F.cosine_similarity(yaw_t, pred[..., SIN_YAW : COS_YAW + 1].detach(), dim=-1) < 0
        allowed = (cls_target[..., None] == self.const("reversible", self.yaw_reversible_classes, cls_target.device, torch.long)).any(-1)
        flip = (opposite & allowed)[..., None]
        yaw_t = torch.where(flip, -yaw_t, yaw_t)
        return torch.cat([box_target[..., :SIN_YAW], yaw_t, box_target[..., COS_YAW + 1 :]], dim=-1)

    # ---- map ---------------------------------------------------------------------------------
    def map(self, batch: Mapping[str, Any], out: "SparseDriveOutput", losses: dict[str, torch.Tensor]) -> None:
        from drivebench.models.sparsedrive.map_loss import map_losses

        assert out.map is not None
        cls_loss, line_loss = map_losses(
            out.map.classification, out.map.prediction, list(batch["gt_map_labels"]), list(batch["gt_map_pts"]),
            list(batch["gt_map_num_orderings"]) if "gt_map_num_orderings" in batch else None,
            self.map_roi, self.num_map_sample, self.map_line_beta, self.cls_threshold_to_reg,
        )
        losses["map_cls"] = self.map_cls_weight * cls_loss
        losses["map_line"] = self.map_line_weight * line_loss

    # ---- motion and planning -----------------------------------------------------------------
    def motion(self, batch: Mapping[str, Any], out: "SparseDriveOutput", targets: PaddedTargets,
               assignment: HungarianResult, losses: dict[str, torch.Tensor]) -> None:
        assert out.motion is not None
        motion_cls, motion_reg = out.motion.motion_cls[-1].float(), out.motion.motion_reg[-1].float()
        b, q, modes, steps, _ = motion_reg.shape
        device = motion_reg.device
        trajs, masks = self._pad_agent_futures(batch, targets, steps, device)
        sample, query, target = assignment.per_layer[-1]
        reg_target = torch.zeros(b, q, steps, 2, device=device)
        reg_target[sample, query] = trajs[sample, target]
        reg_mask = torch.zeros(b, q, steps, device=device)
        reg_mask[sample, query] = masks[sample, target]
        num_pos = positive_count(assignment.num_matched[-1], device)

        pred_cum = motion_reg.cumsum(dim=-2)
        best = winner_take_all(pred_cum, reg_target, reg_mask)  # (B, Q)
        cls_weight = (reg_mask > 0).any(dim=-1).float()
        cls_loss = sigmoid_focal_loss(motion_cls.flatten(0, 1), _one_hot(best.flatten(), modes),
                                      weight=cls_weight.flatten()[:, None], reduction="sum")
        best_traj = torch.gather(pred_cum, 2, best[:, :, None, None, None].expand(-1, -1, 1, steps, 2)).squeeze(2)
        reg_loss = ((best_traj - reg_target).abs() * reg_mask[..., None]).sum()
        losses["motion_cls"] = self.motion_cls_weight * cls_loss / num_pos
        losses["motion_reg"] = self.motion_reg_weight * reg_loss / num_pos

    @staticmethod
    def _pad_agent_futures(batch: Mapping[str, Any], targets: PaddedTargets, steps: int,
                           device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        b, g = targets.labels.shape
        trajs = torch.zeros(b, g, steps, 2, device=device)
        masks = torch.zeros(b, g, steps, device=device)
        for i, (traj, mask) in enumerate(zip(batch["gt_agent_fut_trajs"], batch["gt_agent_fut_masks"])):
            n = targets.counts[i]
            if n == 0:
                continue
            if traj.shape[1] < steps:
                raise ValueError(f"gt_agent_fut_trajs has {traj.shape[1]} steps; the motion head predicts {steps}")
            m = mask[:, :steps].to(device).float()
            trajs[i, :n] = torch.nan_to_num(traj[:, :steps].to(device).float()) * m[..., None]
            masks[i, :n] = m
        return trajs, masks

    def planning(self, batch: Mapping[str, Any], out: "SparseDriveOutput", losses: dict[str, torch.Tensor]) -> None:
        assert out.motion is not None
        plan_cls, plan_reg = out.motion.plan_cls[-1].float(), out.motion.plan_reg[-1].float()
        b, _, n, steps, _ = plan_reg.shape
        num_cmd = batch["gt_ego_fut_cmd"].shape[-1]
        modes = n // num_cmd
        cmd = batch["gt_ego_fut_cmd"].argmax(dim=-1)
        rows = torch.arange(b, device=plan_reg.device)
        cls = plan_cls.view(b, num_cmd, modes)[rows, cmd]  # (B, modes)
        reg = plan_reg.view(b, num_cmd, modes, steps, 2)[rows, cmd]  # (B, modes, T, 2) displacements
        mask = batch["gt_ego_fut_masks"][:, :steps].float()
        target_cum = torch.nan_to_num(batch["gt_ego_fut_trajs"][:, :steps].float()) * mask[..., None]
        target_step = torch.diff(target_cum, dim=1, prepend=torch.zeros_like(target_cum[:, :1]))
        best = winner_take_all(reg.cumsum(dim=-2), target_cum, mask)  # (B,)
        cls_weight = (mask > 0).any(dim=-1).float()
        cls_loss = sigmoid_focal_loss(cls, _one_hot(best, modes), weight=cls_weight[:, None], reduction="mean")
        best_reg = torch.gather(reg, 1, best[:, None, None, None].expand(-1, 1, steps, 2)).squeeze(1)
        reg_loss = ((best_reg - target_step).abs() * mask[..., None]).mean()
        status = out.motion.plan_status[-1].float().squeeze(1)
        status_loss = (status - batch["ego_status"].float()).abs().mean()
        losses["plan_cls"] = self.plan_cls_weight * cls_loss
        losses["plan_reg"] = self.plan_reg_weight * reg_loss
        losses["plan_status"] = self.plan_status_weight * status_loss
