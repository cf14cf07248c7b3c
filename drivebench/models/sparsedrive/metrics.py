"""SparseDrive's validation metrics on in-memory results (host-side numpy).

- detection mAP, TP errors and NDS: ``detection_metric.DetectionMetric``; tracking AMOTA / AMOTP:
  ``tracking_metric.TrackingMetric``.
- ``MotionMetric``: minADE / minFDE / miss rate (2 m) over K=6 modes and EPA, for upstream's two
  groups (vehicles as "car", pedestrians), on detections (score >= 0.2) matched to GT at 2 m
  with the devkit's greedy matching. Upstream reports the devkit's recall-interpolated TP mean;
  this reports the plain mean over matched true positives.
- ``PlanningMetric``: L2 and collision rate at 1/2/3 s (means over the steps up to that time, as
  upstream), samples with incomplete ego futures skipped; collisions use upstream's box-overlap
  check (ego 4.084 x 1.85 m, 0.5 m ahead of the plan point, heading from the plan) against GT
  agent boxes moved along their GT futures (heading kept from the current frame: the batch
  contract carries future centres, not future boxes).
  Beside it, the same L2 of a constant-velocity plan (``plan/cv_L2_*``: the ego's CAN-bus velocity
  held for 3 s), the reference a planner must beat, as QCNet's ``cv_minFDE`` is for forecasts (the
  convergence target is relative to it); over the samples with CAN-bus data (real nuScenes has scenes
  without: their ego status is all zeros, and holding "no velocity" would be standing still).
- map chamfer AP: ``drivebench.models.common.map_metrics`` (shared with MapTR).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
import torch
from torchmetrics import Metric

from drivebench.models.common.sample_records import SampleRecords
from drivebench.models.sparsedrive.boxes import boxes_overlap_bev
from drivebench.models.sparsedrive.decode import ego_boxes
from drivebench.models.sparsedrive.detection_metric import greedy_center_match

MOTION_GROUPS = {"car": (0, 1, 2, 3, 4, 6, 7), "pedestrian": (8,)}
PLAN_STEP_S = 0.5  # nuScenes key frames: the ego future is 6 steps of 0.5 s


def constant_velocity_plan(ego_status: np.ndarray, lidar2ego: np.ndarray, steps: int = 6) -> np.ndarray | None:
    """(steps, 2) ego positions in the LiDAR frame if the ego kept its current velocity: the CAN-bus
    velocity of ``ego_status`` (the batch contract's items 6-8, ego frame) turned into the LiDAR frame,
    times 0.5 s per step, from the current position (the origin of ``gt_ego_fut_trajs``). None for an
    all-zero status: a scene without CAN bus data (``infos.ego_status``), no velocity to hold."""
    status = np.asarray(ego_status, np.float64)
    if not status.any():
        return None
    velocity = np.asarray(lidar2ego, np.float64)[:3, :3].T @ status[6:9]
    return velocity[None, :2] * PLAN_STEP_S * np.arange(1, steps + 1)[:, None]


class MotionMetric(SampleRecords):
    """minADE / minFDE / MR / EPA per upstream group (see module docstring); a torchmetrics ``Metric``
    whose samples are gathered from every DDP rank before ``compute``."""

    def __init__(self, groups: dict[str, Sequence[int]] | None = None, dist_th: float = 2.0, miss_th: float = 2.0,
                 score_threshold: float = 0.2, **kwargs: Any) -> None:
        super().__init__({"xy": 2, "score": 1, "label": 1, "traj": 4, "gt_xy": 2, "gt_label": 1, "gt_traj": 3,
                          "gt_mask": 2}, bool_fields=("gt_mask",), **kwargs)
        self.groups = {k: tuple(v) for k, v in (groups or MOTION_GROUPS).items()}
        self.dist_th, self.miss_th, self.score_threshold = dist_th, miss_th, score_threshold

    def update(self, boxes: np.ndarray, scores: np.ndarray, labels: np.ndarray, trajs: np.ndarray,
               gt_boxes: np.ndarray, gt_labels: np.ndarray, gt_trajs: np.ndarray, gt_masks: np.ndarray) -> None:
        """Predicted (K, 9) boxes, (K,) scores/labels, (K, M, T, 2) absolute futures; GT (G, 9) boxes,
        (G,) labels, (G, T, 2) future offsets from the box centre, (G, T) masks."""
        keep = scores >= self.score_threshold
        self.append_sample(xy=boxes[keep, :2], score=scores[keep], label=labels[keep], traj=trajs[keep],
                           gt_xy=gt_boxes[:, :2], gt_label=gt_labels,
                           gt_traj=gt_trajs + gt_boxes[:, None, :2], gt_mask=gt_masks.astype(bool))

    @staticmethod
    def displacement(pred: np.ndarray, gt: np.ndarray, mask: np.ndarray, miss_th: float) -> tuple[float, float, float]:
        """(M, T, 2) modes vs (T, 2) GT over the valid steps: minADE, minFDE, miss (max error > miss_th for every mode)."""
        steps = np.flatnonzero(mask)
        if len(steps) == 0:
            return 0.0, 0.0, 0.0
        err = np.linalg.norm(pred[:, steps] - gt[None, steps], axis=-1)  # (M, S)
        return float(err.mean(1).min()), float(err[:, -1].min()), float(err.max(1).min() > miss_th)

    def compute(self) -> dict[str, float]:
        out: dict[str, float] = {}
        samples = self.samples()
        for name, classes in self.groups.items():
            sel_p = [np.isin(s["label"], classes) for s in samples]
            sel_g = [np.isin(s["gt_label"], classes) for s in samples]
            npos = int(sum(g.sum() for g in sel_g))
            tp, fp, matches, _ = greedy_center_match([s["xy"][m] for s, m in zip(samples, sel_p)],
                                                  [s["score"][m] for s, m in zip(samples, sel_p)],
                                                  [s["gt_xy"][m] for s, m in zip(samples, sel_g)], self.dist_th)
            errs = []
            for k, j, g in matches:
                s = samples[k]
                pred = s["traj"][sel_p[k]][j]
                errs.append(self.displacement(pred, s["gt_traj"][sel_g[k]][g], s["gt_mask"][sel_g[k]][g], self.miss_th))
            arr = np.array(errs) if errs else np.ones((1, 3))
            out[f"motion/{name}_minADE"] = float(arr[:, 0].mean())
            out[f"motion/{name}_minFDE"] = float(arr[:, 1].mean())
            out[f"motion/{name}_MR"] = float(arr[:, 2].mean())
            hits = sum(1 for e in errs if e[1] < self.miss_th)
            out[f"motion/{name}_EPA"] = (hits - 0.5 * float(fp.sum())) / npos if npos else 0.0
            out[f"motion/{name}_matched"] = float(len(errs))  # 0: the errors above are the placeholder 1
        return out


class PlanningMetric(Metric):
    """Planning L2 and collision rate at 1/2/3 s (see module docstring); a torchmetrics ``Metric``
    of per-step sums and a sample count, summed over DDP ranks before ``compute``."""

    full_state_update = False

    def __init__(self, steps: int = 6, ego_size: tuple[float, float, float] = (1.85, 4.084, 1.56),
                 forward_yaw: float = math.pi / 2, **kwargs: Any) -> None:
        """``forward_yaw``: the ego's heading in the lidar frame (pi/2 for nuScenes' LIDAR_TOP)."""
        super().__init__(**kwargs)
        self.steps, self.ego_size, self.forward_yaw = steps, ego_size, forward_yaw
        self.add_state("l2", default=torch.zeros(steps, dtype=torch.float64), dist_reduce_fx="sum", persistent=False)
        self.add_state("collision", default=torch.zeros(steps, dtype=torch.float64), dist_reduce_fx="sum",
                       persistent=False)
        self.add_state("total", default=torch.zeros((), dtype=torch.long), dist_reduce_fx="sum", persistent=False)
        self.add_state("cv_l2", default=torch.zeros(steps, dtype=torch.float64), dist_reduce_fx="sum", persistent=False)
        self.add_state("cv_total", default=torch.zeros((), dtype=torch.long), dist_reduce_fx="sum", persistent=False)

    def update(self, plan: np.ndarray, gt_plan: np.ndarray, gt_mask: np.ndarray, gt_boxes: np.ndarray,
               gt_agent_trajs: np.ndarray, gt_agent_masks: np.ndarray, cv_plan: np.ndarray | None = None) -> None:
        """One sample: (T, 2) planned and GT ego positions, (T,) mask, GT agents (G, 9) with (G, T', 2)
        cumulative future offsets and (G, T') masks; ``cv_plan``: the constant-velocity plan
        (:func:`constant_velocity_plan`), scored by L2 alone."""
        t = self.steps
        if not gt_mask[:t].all():  # upstream: incomplete ego futures are not counted
            return
        self.l2 += torch.as_tensor(np.linalg.norm(plan[:t] - gt_plan[:t], axis=-1), dtype=torch.float64,
                                   device=self.device)
        if cv_plan is not None:
            self.cv_l2 += torch.as_tensor(np.linalg.norm(cv_plan[:t] - gt_plan[:t], axis=-1), dtype=torch.float64,
                                          device=self.device)
            self.cv_total += 1
        pred_hit = self.collides(plan[:t], gt_boxes, gt_agent_trajs[:, :t], gt_agent_masks[:, :t])
        gt_hit = self.collides(gt_plan[:t], gt_boxes, gt_agent_trajs[:, :t], gt_agent_masks[:, :t])
        self.collision += torch.as_tensor((pred_hit & ~gt_hit).astype(float), device=self.device)
        self.total += 1

    def collides(self, plan: np.ndarray, boxes: np.ndarray, trajs: np.ndarray, masks: np.ndarray) -> np.ndarray:
        """(T,) whether the ego box at each step overlaps a GT agent box at that step."""
        ego = ego_boxes(torch.as_tensor(plan, dtype=torch.float64), self.ego_size, forward_yaw=self.forward_yaw)  # (T, 7)
        if len(boxes) == 0:
            return np.zeros(len(plan), dtype=bool)
        b = torch.as_tensor(boxes, dtype=torch.float64)
        fut = b[:, None, :7].repeat(1, len(plan), 1)
        fut[..., :2] = b[:, None, :2] + torch.as_tensor(trajs, dtype=torch.float64)
        hit = boxes_overlap_bev(ego[None], fut) & torch.as_tensor(masks, dtype=torch.bool)
        return hit.any(dim=0).numpy()

    def compute(self) -> dict[str, float]:
        total = int(self.total)
        if total == 0:
            return {}
        l2 = _by_horizon(self.l2.cpu().numpy() / total)
        col = _by_horizon(self.collision.cpu().numpy() / total)
        out: dict[str, float] = {}
        for horizon in l2:
            if horizon != "avg":
                out[f"plan/L2_{horizon}"], out[f"plan/col_{horizon}"] = l2[horizon], col[horizon]
        out["plan/L2_avg"], out["plan/col_avg"] = l2["avg"], col["avg"]
        if int(self.cv_total):
            out.update({f"plan/cv_L2_{h}": v for h, v in _by_horizon(self.cv_l2.cpu().numpy() / int(self.cv_total)).items()})
        return out


def _by_horizon(per_step: np.ndarray) -> dict[str, float]:
    """Upstream's planning horizons from per-step means (0.5 s steps): ``1s``, ``2s``, ``3s`` each the mean
    over the steps up to that time (those the steps reach), and ``avg`` their mean."""
    out = {f"{seconds}s": float(per_step[: idx + 1].mean())
           for seconds, idx in ((1, 1), (2, 3), (3, 5)) if idx < len(per_step)}
    out["avg"] = float(np.mean(list(out.values())))
    return out


def metric_notes(values: dict[str, float]) -> dict[str, str]:
    """Notes for the summary table: a motion group with no detection matched to a ground-truth agent
    reports minADE / minFDE / MR as the devkit's placeholder 1 (upstream's ``no_predictions``), not a
    measured error (early in training no box scores the 0.2 that motion evaluation needs)."""
    notes = {}
    for key, matched in values.items():
        if key.startswith("motion/") and key.endswith("_matched") and matched == 0:
            group = key[len("motion/"):-len("_matched")]
            for metric in ("minADE", "minFDE", "MR"):
                notes[f"motion/{group}_{metric}"] = (f"placeholder: no {group} detection (score >= 0.2) matched a "
                                                     "ground-truth agent within 2 m, so nothing was measured")
    return notes
