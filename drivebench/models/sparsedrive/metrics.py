"""SparseDrive's validation metrics on in-memory results (host-side numpy).

- ``DetectionAP``: nuScenes detection mAP, a faithful reimplementation of the devkit's
  ``accumulate`` / ``calc_ap`` (centre-distance matching at 0.5/1/2/4 m, 101-point interpolated
  precision, min recall/precision 0.1, class ranges measured from the ego). Not reproduced: the
  devkit's removal of GT boxes without LiDAR/radar points and of bicycles in bike racks (the batch
  has no point counts or rack polygons), attribute/TP errors and NDS.
- ``MotionMetric``: minADE / minFDE / miss rate (2 m) over K=6 modes and EPA, for upstream's two
  groups (vehicles as "car", pedestrians), on detections (score >= 0.2) matched to GT at 2 m
  with the devkit's greedy matching. Upstream reports the devkit's recall-interpolated TP mean;
  this reports the plain mean over matched true positives.
- ``PlanningMetric``: L2 and collision rate at 1/2/3 s (means over the steps up to that time, as
  upstream), samples with incomplete ego futures skipped; collisions use upstream's box-overlap
  check (ego 4.084 x 1.85 m, 0.5 m ahead of the plan point, heading from the plan) against GT
  agent boxes moved along their GT futures (heading kept from the current frame: the batch
  contract carries future centres, not future boxes).
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

NUSCENES_CLASS_RANGE = {
    "car": 50, "truck": 50, "bus": 50, "trailer": 50, "construction_vehicle": 50, "pedestrian": 40,
    "motorcycle": 40, "bicycle": 40, "traffic_cone": 30, "barrier": 30,
}


def _ego_xy_dist(boxes: np.ndarray, lidar2ego: np.ndarray | None) -> np.ndarray:
    xyz = boxes[:, :3]
    if lidar2ego is not None:
        xyz = xyz @ lidar2ego[:3, :3].T + lidar2ego[:3, 3]
    return np.linalg.norm(xyz[:, :2], axis=1)


def interpolated_precision(tp: np.ndarray, fp: np.ndarray, npos: int, nelem: int = 101) -> np.ndarray:
    """Precision at ``nelem`` evenly spaced recalls (0 beyond the reached recall), devkit style."""
    tp_c, fp_c = np.cumsum(tp).astype(float), np.cumsum(fp).astype(float)
    prec = tp_c / (fp_c + tp_c)
    rec = tp_c / float(npos)
    return np.interp(np.linspace(0, 1, nelem), rec, prec, right=0)


def calc_ap(precision: np.ndarray, min_recall: float = 0.1, min_precision: float = 0.1) -> float:
    """Area under the interpolated precision above the minimum recall/precision (devkit ``calc_ap``)."""
    prec = np.copy(precision)[round(100 * min_recall) + 1 :] - min_precision
    prec[prec < 0] = 0
    return float(np.mean(prec)) / (1.0 - min_precision)


def greedy_center_match(pred_xy: list[np.ndarray], pred_scores: list[np.ndarray], gt_xy: list[np.ndarray],
                        dist_th: float) -> tuple[np.ndarray, np.ndarray, list[tuple[int, int, int]]]:
    """The devkit's matching over samples: predictions by descending score (ties: later first),
    each to the closest untaken GT of its sample if closer than ``dist_th``.

    Returns (tp flags, fp flags) in the sorted order and the (sample, pred, gt) matches.
    """
    order = [(float(s), i) for i, s in enumerate(np.concatenate(pred_scores) if pred_scores else [])]
    owner = [(k, j) for k, scores in enumerate(pred_scores) for j in range(len(scores))]
    order.sort()
    order.reverse()
    taken: set[tuple[int, int]] = set()
    tp, fp, matches = [], [], []
    for _, flat in order:
        k, j = owner[flat]
        gts = gt_xy[k]
        best, best_gt = np.inf, -1
        if len(gts):
            dists = np.linalg.norm(gts - pred_xy[k][j], axis=1)
            for g, d in enumerate(dists):
                if (k, g) not in taken and d < best:
                    best, best_gt = d, g
        if best < dist_th:
            taken.add((k, best_gt))
            tp.append(1)
            fp.append(0)
            matches.append((k, j, best_gt))
        else:
            tp.append(0)
            fp.append(1)
    return np.array(tp), np.array(fp), matches


class DetectionAP(SampleRecords):
    """nuScenes detection mAP over accumulated samples (see module docstring); a torchmetrics
    ``Metric`` whose samples are gathered from every DDP rank before ``compute``."""

    def __init__(self, class_names: Sequence[str], dist_ths: Sequence[float] = (0.5, 1.0, 2.0, 4.0),
                 class_range: dict[str, float] | None = None, min_recall: float = 0.1, min_precision: float = 0.1,
                 max_boxes_per_sample: int = 500, **kwargs: Any) -> None:
        super().__init__({"pred_xy": 2, "score": 1, "label": 1, "gt_xy": 2, "gt_label": 1}, **kwargs)
        self.class_names = list(class_names)
        self.dist_ths = tuple(dist_ths)
        self.class_range = dict(NUSCENES_CLASS_RANGE if class_range is None else class_range)
        self.min_recall, self.min_precision, self.max_boxes = min_recall, min_precision, max_boxes_per_sample

    def update(self, boxes: np.ndarray, scores: np.ndarray, labels: np.ndarray, gt_boxes: np.ndarray,
               gt_labels: np.ndarray, lidar2ego: np.ndarray | None = None) -> None:
        """One sample: predicted (K, >=2) boxes / scores / labels and GT (G, >=2) boxes / labels."""
        order = np.argsort(-scores, kind="stable")[: self.max_boxes]
        boxes, scores, labels = boxes[order], scores[order], labels[order]
        keep_p = self._in_range(boxes, labels, lidar2ego)
        keep_g = self._in_range(gt_boxes, gt_labels, lidar2ego)
        self.append_sample(pred_xy=boxes[keep_p, :2], score=scores[keep_p], label=labels[keep_p],
                           gt_xy=gt_boxes[keep_g, :2], gt_label=gt_labels[keep_g])

    def _in_range(self, boxes: np.ndarray, labels: np.ndarray, lidar2ego: np.ndarray | None) -> np.ndarray:
        if len(boxes) == 0:
            return np.zeros(0, dtype=bool)
        limit = np.array([self.class_range.get(self.class_names[int(c)], np.inf) for c in labels])
        return _ego_xy_dist(boxes, lidar2ego) < limit

    def class_ap(self, cls: int, dist_th: float, samples: list[dict[str, np.ndarray]] | None = None) -> float:
        """AP of class ``cls`` at one matching distance (``samples``: :meth:`samples`, read once by ``compute``)."""
        samples = self.samples() if samples is None else samples
        npos = sum(int((s["gt_label"] == cls).sum()) for s in samples)
        if npos == 0:
            return 0.0
        pred_xy = [s["pred_xy"][s["label"] == cls] for s in samples]
        pred_sc = [s["score"][s["label"] == cls] for s in samples]
        gt_xy = [s["gt_xy"][s["gt_label"] == cls] for s in samples]
        tp, fp, _ = greedy_center_match(pred_xy, pred_sc, gt_xy, dist_th)
        if tp.sum() == 0:
            return 0.0
        return calc_ap(interpolated_precision(tp, fp, npos), self.min_recall, self.min_precision)

    def compute(self) -> dict[str, float]:
        out: dict[str, float] = {}
        aps = []
        samples = self.samples()
        for c, name in enumerate(self.class_names):
            ap = float(np.mean([self.class_ap(c, th, samples) for th in self.dist_ths]))
            out[f"AP/{name}"] = ap
            aps.append(ap)
        out["mAP"] = float(np.mean(aps)) if aps else 0.0
        return out


MOTION_GROUPS = {"car": (0, 1, 2, 3, 4, 6, 7), "pedestrian": (8,)}


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
            tp, fp, matches = greedy_center_match([s["xy"][m] for s, m in zip(samples, sel_p)],
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

    def update(self, plan: np.ndarray, gt_plan: np.ndarray, gt_mask: np.ndarray, gt_boxes: np.ndarray,
               gt_agent_trajs: np.ndarray, gt_agent_masks: np.ndarray) -> None:
        """One sample: (T, 2) planned and GT ego positions, (T,) mask, GT agents (G, 9) with (G, T', 2)
        cumulative future offsets and (G, T') masks."""
        t = self.steps
        if not gt_mask[:t].all():  # upstream: incomplete ego futures are not counted
            return
        self.l2 += torch.as_tensor(np.linalg.norm(plan[:t] - gt_plan[:t], axis=-1), dtype=torch.float64,
                                   device=self.device)
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
        l2 = self.l2.cpu().numpy() / total
        col = self.collision.cpu().numpy() / total
        out: dict[str, float] = {}
        for seconds, idx in ((1, 1), (2, 3), (3, 5)):
            if idx < self.steps:
                out[f"plan/L2_{seconds}s"] = float(l2[: idx + 1].mean())
                out[f"plan/col_{seconds}s"] = float(col[: idx + 1].mean())
        out["plan/L2_avg"] = float(np.mean([out[k] for k in out if k.startswith("plan/L2_")]))
        out["plan/col_avg"] = float(np.mean([out[k] for k in out if k.startswith("plan/col_")]))
        return out
