"""nuScenes tracking metrics of SparseDrive's validation: AMOTA and AMOTP (``tracking_nips_2019``).

Written from the benchmark's definition and the devkit's documented behaviour, checked against
``nuscenes.eval.tracking`` (with py-motmetrics) in ``tests/test_sparsedrive_tracking_metric.py``:

- tracks per scene, frames in time order; a predicted track's score is its mean score over the
  scene; gaps inside a track (GT or predicted) are filled by linear interpolation, with the
  devkit's weights (the box nearer in time gets the smaller weight, as its ``interpolate_tracks``
  computes them);
- per class (the seven tracking classes), 40 recall levels from 0.1 to 1: the score threshold of
  each is read from the matched predictions of a pass without threshold; levels never reached
  count as the worst value;
- at each threshold, CLEAR-MOT matching frame by frame (py-motmetrics' rules): a GT keeps the
  prediction it was last matched to while they stay within 2 m (centre distance); the rest are
  assigned by a minimum-distance assignment over pairs within 2 m, a GT matched to a prediction
  other than its previous one is an identity switch; unassigned GT are misses, unassigned
  predictions false positives;
- MOTAR = max(0, 1 - (misses + switches + false positives - (1 - r) P) / (r P)) with P the GT
  count and r = matches / P; AMOTA = the mean of MOTAR over the 40 levels (unreached or undefined:
  0), AMOTP = the mean of the matched distance (undefined: 2 m); the overall values are means
  over the classes with GT.

Predictions are upstream's tracking output: detections with class score >= 0.2 carrying the
instance bank's track ids, ranked by their detection score. Inputs differ from the devkit's as for
detection (``detection_metric``): LiDAR frame of the key frame, ego-frame ranges, GT without
points already dropped, no bike-rack filter. Distances are exact Euclidean norms (the devkit's
sklearn distances round at about 1e-8).
"""

from __future__ import annotations

import math
from bisect import bisect
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
from scipy.optimize import linear_sum_assignment

from drivebench.models.common.sample_records import SampleRecords
from drivebench.models.sparsedrive.detection_metric import ego_xy_distance

TRACKING_CLASS_RANGE = {"car": 50, "truck": 50, "bus": 50, "trailer": 50, "pedestrian": 40, "motorcycle": 40,
                        "bicycle": 40}
NUM_THRESHOLDS = 40
WORST = {"amota": 0.0, "amotp": 2.0}


@dataclass
class Frame:
    """The boxes of one class-agnostic frame: track ids, class labels, ground-plane centres, scores."""

    ids: list[int] = field(default_factory=list)
    labels: list[int] = field(default_factory=list)
    xy: list[np.ndarray] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)


def interpolate_tracks(frames: list[Frame], times: Sequence[float]) -> None:
    """Fill the gaps of every track inside its own time span, in place (the devkit's rule and order:
    per frame, the missing tracks in order of first appearance, appended after the frame's boxes)."""
    track_times: dict[int, list[float]] = {}
    track_boxes: dict[int, list[tuple[int, np.ndarray, float]]] = {}
    for t, frame in zip(times, frames):
        for tid, label, xy, score in zip(frame.ids, frame.labels, frame.xy, frame.scores):
            track_times.setdefault(tid, []).append(t)
            track_boxes.setdefault(tid, []).append((label, xy, score))
    for t, frame in zip(times, frames):
        for tid, ts in track_times.items():
            if ts[0] <= t <= ts[-1] and t not in ts:
                right = bisect(ts, t)
                left = right - 1
                ratio = (ts[right] - t) / (ts[right] - ts[left])  # the devkit's weight of the right box
                (_, xy_l, s_l), (label_r, xy_r, s_r) = track_boxes[tid][left], track_boxes[tid][right]
                frame.ids.append(tid)
                frame.labels.append(label_r)
                frame.xy.append((1.0 - ratio) * xy_l + ratio * xy_r)
                frame.scores.append((1.0 - ratio) * s_l + ratio * s_r)


def assignment(dist: np.ndarray) -> list[tuple[int, int]]:
    """Minimum-cost assignment over the finite entries of ``dist`` (NaN: not allowed), the largest
    number of allowed pairs first: forbidden pairs cost more than any all-allowed assignment."""
    valid = np.isfinite(dist)
    if not valid.any():
        return []
    cost = dist.copy()
    if not valid.all():
        bound = np.abs(dist[valid]).max() + 1
        cost[~valid] = 2 * min(dist.shape) * bound + 1
    rows, cols = linear_sum_assignment(cost)
    return [(int(i), int(j)) for i, j in zip(rows, cols) if valid[i, j]]


@dataclass
class MotCounts:
    matches: int = 0
    switches: int = 0
    misses: int = 0
    false_positives: int = 0
    distance: float = 0.0  # summed over matches and switches

    def add(self, other: "MotCounts") -> None:
        self.matches += other.matches
        self.switches += other.switches
        self.misses += other.misses
        self.false_positives += other.false_positives
        self.distance += other.distance

    def motar(self) -> float:
        objects = self.matches + self.switches + self.misses
        recall = self.matches / objects if objects else 0.0
        denominator = recall * objects
        if denominator == 0:
            return math.nan
        numerator = (self.misses + self.switches + self.false_positives) - (1 - recall) * objects
        return max(0.0, 1.0 - numerator / denominator)

    def motp(self) -> float:
        detections = self.matches + self.switches
        return self.distance / detections if detections else math.nan


class SceneMatcher:
    """CLEAR-MOT matching of one scene, frame by frame (py-motmetrics' ``MOTAccumulator.update`` rules)."""

    def __init__(self) -> None:
        self.matched_to: dict[int, int] = {}  # GT id -> prediction id of its latest match

    def update(self, gt_ids: list[int], pred_ids: list[int], dist: np.ndarray) -> tuple[MotCounts, list[int]]:
        """One frame; ``dist`` (G, P) with NaN where a pair may not match. Returns the counts and the
        prediction ids of this frame's plain matches (not switches)."""
        counts, matched_preds = MotCounts(), []
        gt_done, pred_done = np.zeros(len(gt_ids), bool), np.zeros(len(pred_ids), bool)
        if len(gt_ids) and len(pred_ids):
            dist = dist.copy()
            pred_pos = {}
            for j, h in enumerate(pred_ids):
                pred_pos.setdefault(h, []).append(j)
            for i, o in enumerate(gt_ids):  # 1. keep the previous correspondence while it is within reach
                if o not in self.matched_to:
                    continue
                free = [j for j in pred_pos.get(self.matched_to[o], []) if not pred_done[j]]
                if free and np.isfinite(dist[i, free[0]]):
                    j = free[0]
                    gt_done[i] = pred_done[j] = True
                    counts.matches += 1
                    counts.distance += float(dist[i, j])
                    matched_preds.append(pred_ids[j])
            dist[gt_done, :] = np.nan  # 2. assign the rest
            dist[:, pred_done] = np.nan
            for i, j in assignment(dist):
                o, h = gt_ids[i], pred_ids[j]
                if o in self.matched_to and self.matched_to[o] != h:
                    counts.switches += 1
                else:
                    counts.matches += 1
                    matched_preds.append(h)
                counts.distance += float(dist[i, j])
                gt_done[i] = pred_done[j] = True
                self.matched_to[o] = h
        counts.misses += int((~gt_done).sum())
        counts.false_positives += int((~pred_done).sum())
        return counts, matched_preds


class TrackingMetric(SampleRecords):
    """nuScenes AMOTA / AMOTP over accumulated samples (see module docstring); a torchmetrics ``Metric``
    whose samples are gathered from every DDP rank before ``compute``. Samples seen twice (the
    validation sampler replays sequences to even out its streams) count once."""

    def __init__(self, class_names: Sequence[str], class_range: dict[str, float] | None = None,
                 dist_th: float = 2.0, min_recall: float = 0.1, num_thresholds: int = NUM_THRESHOLDS,
                 score_threshold: float = 0.2, max_boxes_per_sample: int = 500, **kwargs: Any) -> None:
        super().__init__({"scene": 1, "time": 1, "xy": 2, "score": 1, "label": 1, "track": 1, "gt_xy": 2,
                          "gt_label": 1, "gt_track": 1}, **kwargs)
        self.class_names = list(class_names)
        self.class_range = dict(TRACKING_CLASS_RANGE if class_range is None else class_range)
        self.tracking_classes = [c for c, name in enumerate(self.class_names) if name in self.class_range]
        self.dist_th, self.min_recall, self.num_thresholds = dist_th, min_recall, num_thresholds
        self.score_threshold, self.max_boxes = score_threshold, max_boxes_per_sample

    def update(self, boxes: np.ndarray, scores: np.ndarray, cls_scores: np.ndarray, labels: np.ndarray,
               track_ids: np.ndarray, gt_boxes: np.ndarray, gt_labels: np.ndarray, gt_ids: np.ndarray,
               scene: int, timestamp: float, lidar2ego: np.ndarray | None = None) -> None:
        """One sample: (K, >=2) predicted boxes with ranking ``scores``, class scores (the >= 0.2 filter),
        labels and track ids; GT (G, >=2) boxes, labels and instance ids; its scene and time (s)."""
        keep = np.argsort(-scores, kind="stable")[: self.max_boxes]
        keep = keep[(cls_scores[keep] >= self.score_threshold) & self._in_range(boxes[keep], labels[keep], lidar2ego)]
        keep_g = self._in_range(gt_boxes, gt_labels, lidar2ego)
        self.append_sample(scene=np.array([scene], np.int64), time=np.array([timestamp], np.float64),
                           xy=np.asarray(boxes[keep, :2], np.float64), score=np.asarray(scores[keep], np.float64),
                           label=np.asarray(labels[keep], np.int64), track=np.asarray(track_ids[keep], np.int64),
                           gt_xy=np.asarray(gt_boxes[keep_g, :2], np.float64),
                           gt_label=np.asarray(gt_labels[keep_g], np.int64), gt_track=np.asarray(gt_ids[keep_g], np.int64))

    def _in_range(self, boxes: np.ndarray, labels: np.ndarray, lidar2ego: np.ndarray | None) -> np.ndarray:
        if len(boxes) == 0:
            return np.zeros(0, dtype=bool)
        limit = np.array([self.class_range.get(self.class_names[int(c)], -np.inf) for c in labels])
        return ego_xy_distance(boxes, lidar2ego) < limit

    # ---- evaluation ------------------------------------------------------------------------------
    def scenes(self) -> list[tuple[list[Frame], list[Frame]]]:
        """Per scene (GT frames, predicted frames) in time order, track scores averaged, gaps interpolated."""
        by_scene: dict[int, dict[float, dict[str, np.ndarray]]] = {}
        for s in self.samples():
            frames = by_scene.setdefault(int(s["scene"][0]), {})
            frames.setdefault(float(s["time"][0]), s)  # a replayed sample counts once
        out = []
        for scene in sorted(by_scene):
            times = sorted(by_scene[scene])
            gt = [Frame(list(f["gt_track"]), list(f["gt_label"]), list(f["gt_xy"]), [-1.0] * len(f["gt_track"]))
                  for f in (by_scene[scene][t] for t in times)]
            pred = [Frame(list(f["track"]), list(f["label"]), list(f["xy"]), list(f["score"]))
                    for f in (by_scene[scene][t] for t in times)]
            track_scores: dict[int, list[float]] = {}
            for frame in pred:
                for tid, score in zip(frame.ids, frame.scores):
                    track_scores.setdefault(tid, []).append(score)
            mean_score = {tid: float(np.mean(v)) for tid, v in track_scores.items()}
            for frame in pred:
                frame.scores = [mean_score[tid] for tid in frame.ids]
            interpolate_tracks(gt, times)
            interpolate_tracks(pred, times)
            out.append((gt, pred))
        return out

    def _run(self, scenes: list[tuple[list[Frame], list[Frame]]], cls: int,
             threshold: float | None) -> tuple[MotCounts, list[float]]:
        """Match every scene at one score threshold (None: all predictions); the counts and the
        scores of the matched predictions."""
        total, matched_scores = MotCounts(), []
        for gt_frames, pred_frames in scenes:
            matcher = SceneMatcher()
            for gt, pred in zip(gt_frames, pred_frames):
                g = [k for k, c in enumerate(gt.labels) if c == cls]
                p = [k for k, c in enumerate(pred.labels) if c == cls and (threshold is None or pred.scores[k] >= threshold)]
                if not g and not p:
                    continue
                dist = np.full((len(g), len(p)), np.nan)
                if g and p:
                    gxy, pxy = np.stack([gt.xy[k] for k in g]), np.stack([pred.xy[k] for k in p])
                    dist = np.linalg.norm(gxy[:, None] - pxy[None], axis=-1)
                    dist[dist >= self.dist_th] = np.nan
                counts, matched = matcher.update([gt.ids[k] for k in g], [pred.ids[k] for k in p], dist)
                total.add(counts)
                if threshold is None:
                    matched_scores += [pred.scores[k] for k in p if pred.ids[k] in matched]
        return total, matched_scores

    def class_values(self, scenes: list[tuple[list[Frame], list[Frame]]], cls: int) -> tuple[float, float]:
        """(AMOTA, AMOTP) of one class; NaN for both without GT of the class."""
        gt_count = sum(c == cls for gt_frames, _ in scenes for frame in gt_frames for c in frame.labels)
        if gt_count == 0:
            return math.nan, math.nan
        _, scores = self._run(scenes, cls, None)
        motar = np.full(self.num_thresholds, math.nan)
        motp = np.full(self.num_thresholds, math.nan)
        if scores:
            ranked = np.sort(np.array(scores))[::-1]
            recall = np.arange(1, len(ranked) + 1) / gt_count
            levels = np.linspace(self.min_recall, 1, self.num_thresholds).round(12)
            thresholds = np.interp(levels, recall, ranked, right=0)
            thresholds[levels > recall.max()] = math.nan
            done: dict[float, tuple[float, float]] = {}
            for k, th in enumerate(thresholds):
                if math.isnan(th):
                    continue
                if th not in done:
                    counts, _ = self._run(scenes, cls, float(th))
                    done[th] = (counts.motar(), counts.motp())
                motar[k], motp[k] = done[th]
        motar[np.isnan(motar)] = WORST["amota"]
        motp[np.isnan(motp)] = WORST["amotp"]
        return float(motar.mean()), float(motp.mean())

    def compute(self) -> dict[str, float]:
        """``AMOTA``, ``AMOTP`` (means over the classes with GT) and ``AMOTA/<class>``; empty without GT."""
        scenes = self.scenes()
        out: dict[str, float] = {}
        amota, amotp = [], []
        for cls in self.tracking_classes:
            a, p = self.class_values(scenes, cls)
            if math.isnan(a):
                continue
            out[f"AMOTA/{self.class_names[cls]}"] = a
            amota.append(a)
            amotp.append(p)
        if amota:
            out["AMOTA"] = float(np.mean(amota))
            out["AMOTP"] = float(np.mean(amotp))
        return out
