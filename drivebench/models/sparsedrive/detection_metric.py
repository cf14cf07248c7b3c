"""nuScenes detection metrics of SparseDrive's validation: mAP, the true-positive errors and NDS.

The definitions are the nuScenes detection benchmark's (``detection_cvpr_2019``), written here from
the devkit's documented behaviour and checked against ``nuscenes.eval.detection`` in
``tests/test_sparsedrive_detection_metric.py``:

- matching: per class, predictions in descending score (ties: the later one first) each take the
  closest untaken GT of their sample by centre distance in the ground plane, if closer than the
  threshold; AP at 0.5 / 1 / 2 / 4 m: precision at 101 recall points, the bins above recall 0.1,
  minus precision 0.1, normalised; mAP over the ten classes (a class without GT counts as 0);
- true-positive errors of the matches at 2 m, as running means over the ranked matches read at the
  101 recall points and averaged from recall 0.1 to the highest recall reached (1 when never
  reached): ATE (centre distance, m), ASE (1 - IoU of the aligned sizes), AOE (yaw difference, rad;
  barrier yaw is only defined up to 180 degrees), AVE (velocity L2, m/s), AAE (1 - attribute
  accuracy); GT without velocity or attribute are left out of those; traffic cones have no
  AOE / AVE / AAE and barriers no AVE / AAE; the mean of each error over the classes that define it;
- NDS = (5 mAP + sum over the five errors of (1 - min(1, error))) / 10.

Where the inputs differ from the devkit's: boxes are in the LiDAR frame of the key frame rather
than the global frame (equal for a level ego; distances, yaw and velocity differences are the same
under the yaw of the ego pose); class ranges are measured from the ego in its own frame; GT boxes
without LiDAR points are already dropped by the data pipeline (the devkit also keeps boxes with
only radar points); bicycles and motorcycles in bike racks are not removed (the batch has no rack
boxes). Predicted attributes follow upstream SparseDrive's rule (from the class and the speed), as
the model predicts none.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from drivebench.data.nuscenes import ATTRIBUTE_NAMES  # GT and predicted attributes index it, -1 = none
from drivebench.models.common.sample_records import SampleRecords

NUSCENES_CLASS_RANGE = {
    "car": 50, "truck": 50, "bus": 50, "trailer": 50, "construction_vehicle": 50, "pedestrian": 40,
    "motorcycle": 40, "bicycle": 40, "traffic_cone": 30, "barrier": 30,
}
TP_ERRORS = {"trans_err": "mATE", "scale_err": "mASE", "orient_err": "mAOE", "vel_err": "mAVE", "attr_err": "mAAE"}
# errors the benchmark does not score for a class
UNDEFINED_ERRORS = {"traffic_cone": ("attr_err", "vel_err", "orient_err"), "barrier": ("attr_err", "vel_err")}
# upstream SparseDrive's attribute of a detection: (moving: speed > 0.2 m/s, standing) per class
_UPSTREAM_ATTRIBUTE = {
    "car": ("vehicle.moving", "vehicle.parked"), "truck": ("vehicle.moving", "vehicle.parked"),
    "construction_vehicle": ("vehicle.moving", "vehicle.parked"), "bus": ("vehicle.moving", "vehicle.stopped"),
    "trailer": ("vehicle.moving", "vehicle.parked"), "motorcycle": ("cycle.with_rider", "cycle.without_rider"),
    "bicycle": ("cycle.with_rider", "cycle.without_rider"), "pedestrian": ("pedestrian.moving", "pedestrian.standing"),
    "barrier": ("", ""), "traffic_cone": ("", ""),
}
NELEM = 101  # recall points of the curves


def attribute_index(name: str) -> int:
    """Index of an attribute name in :data:`ATTRIBUTE_NAMES`; -1 for '' (none)."""
    return ATTRIBUTE_NAMES.index(name) if name else -1


def predicted_attributes(labels: np.ndarray, velocity: np.ndarray, class_names: Sequence[str]) -> np.ndarray:
    """(K,) attribute indices for detections of ``labels`` with (K, 2) velocities (upstream's rule)."""
    speed = np.linalg.norm(velocity, axis=1) if len(velocity) else np.zeros(0)
    out = np.full(len(labels), -1, dtype=np.int64)
    for i, (c, v) in enumerate(zip(labels, speed)):
        moving, still = _UPSTREAM_ATTRIBUTE.get(class_names[int(c)], ("", ""))
        out[i] = attribute_index(moving if v > 0.2 else still)
    return out


def ego_xy_distance(boxes: np.ndarray, lidar2ego: np.ndarray | None) -> np.ndarray:
    """Ground-plane distance of box centres from the ego (the lidar origin without ``lidar2ego``)."""
    xyz = boxes[:, :3]
    if lidar2ego is not None:
        xyz = xyz @ lidar2ego[:3, :3].T + lidar2ego[:3, 3]
    return np.linalg.norm(xyz[:, :2], axis=1)


def calc_ap(precision: np.ndarray, min_recall: float = 0.1, min_precision: float = 0.1) -> float:
    """Area under the interpolated precision above the minimum recall/precision (devkit ``calc_ap``)."""
    prec = np.copy(precision)[round(100 * min_recall) + 1 :] - min_precision
    prec[prec < 0] = 0
    return float(np.mean(prec)) / (1.0 - min_precision)


def greedy_center_match(pred_xy: list[np.ndarray], pred_scores: list[np.ndarray], gt_xy: list[np.ndarray],
                        dist_th: float) -> tuple[np.ndarray, np.ndarray, list[tuple[int, int, int]], np.ndarray]:
    """The devkit's matching over samples: predictions by descending score (ties: later first),
    each to the closest untaken GT of its sample if closer than ``dist_th``.

    Returns (tp flags, fp flags, scores) in the ranked order and the (sample, pred, gt) matches.
    """
    flat_scores = np.concatenate(pred_scores) if pred_scores else np.zeros(0)
    order = sorted(((float(s), i) for i, s in enumerate(flat_scores)), reverse=True)
    owner = [(k, j) for k, scores in enumerate(pred_scores) for j in range(len(scores))]
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
    conf = np.array([s for s, _ in order], dtype=float)
    return np.array(tp), np.array(fp), matches, conf


def cummean(x: np.ndarray) -> np.ndarray:
    """Running mean that skips NaNs (all NaN: ones, the worst value)."""
    valid = ~np.isnan(x)
    if not valid.any():
        return np.ones(len(x))
    sums = np.nancumsum(x.astype(float))
    counts = np.cumsum(valid)
    return np.divide(sums, counts, out=np.zeros_like(sums), where=counts != 0)


def yaw_difference(gt_yaw: float, pred_yaw: float, period: float = 2 * math.pi) -> float:
    """Smallest absolute angle from ``pred_yaw`` to ``gt_yaw`` for a heading of ``period`` (in [0, pi])."""
    diff = (gt_yaw - pred_yaw + period / 2) % period - period / 2
    if diff > math.pi:
        diff -= 2 * math.pi
    return abs(diff)


def aligned_size_iou(gt_wlh: np.ndarray, pred_wlh: np.ndarray) -> float:
    """3D IoU of two boxes of these sizes with the same centre and heading."""
    inter = float(np.prod(np.minimum(gt_wlh, pred_wlh)))
    return inter / (float(np.prod(gt_wlh)) + float(np.prod(pred_wlh)) - inter)


@dataclass
class ClassCurve:
    """One class at one matching distance: precision and confidence at the 101 recall points and,
    when something matched, every true-positive error read at the same points."""

    precision: np.ndarray
    confidence: np.ndarray
    errors: dict[str, np.ndarray] | None

    @classmethod
    def no_predictions(cls) -> "ClassCurve":
        return cls(np.zeros(NELEM), np.zeros(NELEM), None)

    def ap(self, min_recall: float, min_precision: float) -> float:
        return calc_ap(self.precision, min_recall, min_precision)

    def tp_error(self, name: str, min_recall: float) -> float:
        """Mean error from just above ``min_recall`` to the highest recall reached; 1 if never reached."""
        nonzero = np.flatnonzero(self.confidence)
        last = int(nonzero[-1]) if len(nonzero) else 0
        first = round(100 * min_recall) + 1
        if self.errors is None or last < first:
            return 1.0
        return float(np.mean(self.errors[name][first:last + 1]))


def class_curve(samples: list[dict[str, np.ndarray]], cls: int, dist_th: float, orient_period: float) -> ClassCurve:
    """Match class ``cls`` over the samples at ``dist_th`` and build its curves (devkit ``accumulate``)."""
    npos = sum(int((s["gt_label"] == cls).sum()) for s in samples)
    if npos == 0:
        return ClassCurve.no_predictions()
    preds = [s["box"][s["label"] == cls] for s in samples]
    pred_attr = [s["attr"][s["label"] == cls] for s in samples]
    scores = [s["score"][s["label"] == cls] for s in samples]
    gts = [s["gt_box"][s["gt_label"] == cls] for s in samples]
    gt_attr = [s["gt_attr"][s["gt_label"] == cls] for s in samples]
    tp, fp, matches, conf = greedy_center_match([p[:, :2] for p in preds], scores, [g[:, :2] for g in gts], dist_th)
    if not matches:
        return ClassCurve.no_predictions()
    errs: dict[str, list[float]] = {name: [] for name in TP_ERRORS}
    match_conf = []
    for k, j, g in matches:
        p, t = preds[k][j], gts[k][g]
        errs["trans_err"].append(float(np.linalg.norm(p[:2] - t[:2])))
        errs["vel_err"].append(float(np.linalg.norm(p[7:9] - t[7:9])))  # NaN where the GT has no velocity
        errs["scale_err"].append(1.0 - aligned_size_iou(t[3:6], p[3:6]))
        errs["orient_err"].append(yaw_difference(float(t[6]), float(p[6]), orient_period))
        a_gt, a_pred = int(gt_attr[k][g]), int(pred_attr[k][j])
        errs["attr_err"].append(math.nan if a_gt < 0 else 1.0 - float(a_gt == a_pred))
        match_conf.append(float(scores[k][j]))
    tp_c, fp_c = np.cumsum(tp).astype(float), np.cumsum(fp).astype(float)
    rec = tp_c / float(npos)
    recall_points = np.linspace(0, 1, NELEM)
    precision = np.interp(recall_points, rec, tp_c / (fp_c + tp_c), right=0)
    confidence = np.interp(recall_points, rec, conf, right=0)
    conf_m = np.array(match_conf)
    # each running mean read at the confidence of each recall point (np.interp wants increasing x)
    errors = {name: np.interp(confidence[::-1], conf_m[::-1], cummean(np.array(v))[::-1])[::-1]
              for name, v in errs.items()}
    return ClassCurve(precision, confidence, errors)


class DetectionMetric(SampleRecords):
    """nuScenes detection mAP, TP errors and NDS over accumulated samples (see module docstring); a
    torchmetrics ``Metric`` whose samples are gathered from every DDP rank before ``compute``."""

    def __init__(self, class_names: Sequence[str], dist_ths: Sequence[float] = (0.5, 1.0, 2.0, 4.0),
                 dist_th_tp: float = 2.0, class_range: dict[str, float] | None = None, min_recall: float = 0.1,
                 min_precision: float = 0.1, max_boxes_per_sample: int = 500, mean_ap_weight: int = 5,
                 **kwargs: Any) -> None:
        super().__init__({"box": 2, "score": 1, "label": 1, "attr": 1, "gt_box": 2, "gt_label": 1, "gt_attr": 1},
                         **kwargs)
        if dist_th_tp not in dist_ths:
            raise ValueError(f"dist_th_tp={dist_th_tp} must be one of the matching distances {tuple(dist_ths)}")
        self.class_names = list(class_names)
        self.dist_ths = tuple(dist_ths)
        self.dist_th_tp = dist_th_tp
        self.class_range = dict(NUSCENES_CLASS_RANGE if class_range is None else class_range)
        self.min_recall, self.min_precision, self.max_boxes = min_recall, min_precision, max_boxes_per_sample
        self.mean_ap_weight = mean_ap_weight

    def update(self, boxes: np.ndarray, scores: np.ndarray, labels: np.ndarray, gt_boxes: np.ndarray,
               gt_labels: np.ndarray, lidar2ego: np.ndarray | None = None, gt_attrs: np.ndarray | None = None,
               gt_velocity_valid: np.ndarray | None = None) -> None:
        """One sample: predicted (K, 9) boxes (x, y, z, w, l, h, yaw, vx, vy) / scores / labels and
        GT (G, 9) boxes / labels; ``gt_attrs``: (G,) attribute indices (-1 none; all none if
        omitted); ``gt_velocity_valid``: (G,) whether the GT velocity is known (all if omitted)."""
        boxes, gt_boxes = np.asarray(boxes, dtype=np.float64), np.array(gt_boxes, dtype=np.float64)
        order = np.argsort(-scores, kind="stable")[: self.max_boxes]
        boxes, scores, labels = boxes[order], scores[order], labels[order]
        if gt_velocity_valid is not None:
            gt_boxes[~np.asarray(gt_velocity_valid, dtype=bool), 7:9] = np.nan
        gt_attrs = np.full(len(gt_boxes), -1, np.int64) if gt_attrs is None else np.asarray(gt_attrs, np.int64)
        keep_p = self._in_range(boxes, labels, lidar2ego)
        keep_g = self._in_range(gt_boxes, gt_labels, lidar2ego)
        attrs = predicted_attributes(labels[keep_p], boxes[keep_p, 7:9], self.class_names)
        self.append_sample(box=boxes[keep_p], score=scores[keep_p], label=labels[keep_p], attr=attrs,
                           gt_box=gt_boxes[keep_g], gt_label=gt_labels[keep_g], gt_attr=gt_attrs[keep_g])

    def _in_range(self, boxes: np.ndarray, labels: np.ndarray, lidar2ego: np.ndarray | None) -> np.ndarray:
        if len(boxes) == 0:
            return np.zeros(0, dtype=bool)
        limit = np.array([self.class_range.get(self.class_names[int(c)], np.inf) for c in labels])
        return ego_xy_distance(boxes, lidar2ego) < limit

    def curve(self, cls: int, dist_th: float, samples: list[dict[str, np.ndarray]] | None = None) -> ClassCurve:
        """Curves of class ``cls`` at one matching distance (``samples``: :meth:`samples`, read once by ``compute``)."""
        samples = self.samples() if samples is None else samples
        period = math.pi if self.class_names[cls] == "barrier" else 2 * math.pi
        return class_curve(samples, cls, dist_th, period)

    def class_ap(self, cls: int, dist_th: float, samples: list[dict[str, np.ndarray]] | None = None) -> float:
        return self.curve(cls, dist_th, samples).ap(self.min_recall, self.min_precision)

    def compute(self) -> dict[str, float]:
        out: dict[str, float] = {}
        samples = self.samples()
        aps, class_errors = [], {name: [] for name in TP_ERRORS}
        for c, name in enumerate(self.class_names):
            curves = {th: self.curve(c, th, samples) for th in self.dist_ths}
            ap = float(np.mean([curves[th].ap(self.min_recall, self.min_precision) for th in self.dist_ths]))
            out[f"AP/{name}"] = ap
            aps.append(ap)
            for err in TP_ERRORS:
                undefined = err in UNDEFINED_ERRORS.get(name, ())
                class_errors[err].append(math.nan if undefined else curves[self.dist_th_tp].tp_error(err, self.min_recall))
        out["mAP"] = float(np.mean(aps)) if aps else 0.0
        scores = []
        for err, key in TP_ERRORS.items():
            values = np.array(class_errors[err], dtype=float)
            mean_err = float(np.nanmean(values)) if np.isfinite(values).any() else 1.0
            out[key] = mean_err
            scores.append(max(0.0, 1.0 - mean_err))
        out["NDS"] = (self.mean_ap_weight * out["mAP"] + float(np.sum(scores))) / (self.mean_ap_weight + len(scores))
        return out
