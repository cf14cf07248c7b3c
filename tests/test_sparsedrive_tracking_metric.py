"""SparseDrive's nuScenes tracking metric (AMOTA / AMOTP): hand cases, and the devkit's own tracking
evaluation (``nuscenes.eval.tracking`` with py-motmetrics: its filter, ``create_tracks`` with score
averaging and interpolation, ``TrackingEvaluation`` and the AMOTA aggregation) on hand-made tracks."""

from __future__ import annotations

import numpy as np
import pytest

from drivebench.models.sparsedrive.model import DETECTION_CLASSES
from drivebench.models.sparsedrive.tracking_metric import SceneMatcher, TrackingMetric

CAR, PED, BUS, BARRIER = (DETECTION_CLASSES.index(n) for n in ("car", "pedestrian", "bus", "barrier"))


def _boxes(xy) -> np.ndarray:
    xy = np.asarray(xy, float).reshape(-1, 2)
    return np.concatenate([xy, np.zeros((len(xy), 7))], axis=1)


def _update(metric, scene, t, pred_xy, scores, labels, ids, gt_xy, gt_labels, gt_ids, cls_scores=None):
    scores = np.asarray(scores, float)
    metric.update(_boxes(pred_xy), scores, scores if cls_scores is None else np.asarray(cls_scores, float),
                  np.asarray(labels), np.asarray(ids), _boxes(gt_xy), np.asarray(gt_labels), np.asarray(gt_ids),
                  scene, t)


def test_matcher_keeps_tracks_and_counts_switches() -> None:
    matcher = SceneMatcher()
    c, _ = matcher.update([1, 2], [10, 20], np.array([[0.1, np.nan], [np.nan, 0.2]]))
    assert (c.matches, c.switches, c.misses, c.false_positives) == (2, 0, 0, 0)
    # GT 1 is now nearer prediction 20 but stays with 10 while 10 is within reach
    c, _ = matcher.update([1, 2], [10, 20], np.array([[1.5, 0.1], [np.nan, 0.3]]))
    assert (c.matches, c.switches) == (2, 0)
    # prediction 10 is gone: GT 1 takes 30, an identity switch; GT 2 is missed
    c, matched = matcher.update([1, 2], [30], np.array([[0.4], [np.nan]]))
    assert (c.matches, c.switches, c.misses, c.false_positives) == (0, 1, 1, 0) and matched == []
    assert c.distance == pytest.approx(0.4)


def test_perfect_tracks_score_amota_one_and_a_swap_costs() -> None:
    perfect, swapped = TrackingMetric(DETECTION_CLASSES), TrackingMetric(DETECTION_CLASSES)
    for t in range(6):
        gt = [[5.0 + t, 0.0], [5.0 + t, 10.0]]
        _update(perfect, 0, 0.5 * t, gt, [0.9, 0.8], [CAR, CAR], [7, 8], gt, [CAR, CAR], [1, 2])
        ids = [7, 8] if t < 3 else [8, 7]  # the tracker swaps identities halfway
        _update(swapped, 0, 0.5 * t, gt, [0.9, 0.8], [CAR, CAR], ids, gt, [CAR, CAR], [1, 2])
    out = perfect.compute()
    assert out["AMOTA"] == pytest.approx(1.0) and out["AMOTP"] == pytest.approx(0.0)
    assert set(out) == {"AMOTA", "AMOTP", "AMOTA/car"}  # only classes with GT
    assert swapped.compute()["AMOTA"] < 0.9


def test_filters_class_score_range_and_replayed_samples() -> None:
    metric = TrackingMetric(DETECTION_CLASSES)
    # a barrier is not a tracking class; a pedestrian 45 m away is out of range; the car's class
    # score 0.1 is below the 0.2 tracking threshold
    _update(metric, 0, 0.0, [[1, 1], [45, 0], [3, 3]], [0.9, 0.9, 0.9], [BARRIER, PED, CAR], [1, 2, 3],
            [[1, 1], [45, 0], [3, 3]], [BARRIER, PED, CAR], [1, 2, 3], cls_scores=[0.9, 0.9, 0.1])
    _update(metric, 0, 0.0, [[3, 3]], [0.9], [CAR], [3], [[3, 3]], [CAR], [3])  # the same sample, replayed
    (gt, pred), = metric.scenes()
    assert gt[0].ids == [3] and pred[0].ids == []
    assert metric.compute() == {"AMOTA/car": 0.0, "AMOTA": 0.0, "AMOTP": 2.0}


class _Scenes:
    """What the devkit's ``create_tracks`` / ``filter_eval_boxes`` read of a NuScenes: samples chained
    in scenes named as the mini_val split's, without annotations (no bike racks)."""

    def __init__(self, frames_per_scene: dict[str, int]) -> None:
        self.samples, self.scenes = {}, {}
        for name, n in frames_per_scene.items():
            tokens = [f"{name}-{i}" for i in range(n)]
            self.scenes[name] = {"name": name, "first_sample_token": tokens[0], "last_sample_token": tokens[-1]}
            for i, tok in enumerate(tokens):
                self.samples[tok] = {"scene_token": name, "timestamp": 1_000_000 + 500_000 * i, "anns": [],
                                     "next": tokens[i + 1] if i + 1 < n else ""}

    def get(self, table: str, token: str) -> dict:
        return (self.samples if table == "sample" else self.scenes)[token]


def _random_tracks(seed: int, frames: int = 8):
    """Two scenes of moving cars, pedestrians and buses (plus barriers), tracked with noise, dropped
    frames (gaps the devkit interpolates), identity swaps, false positives, far boxes, scores that
    vary along a track and class scores around the 0.2 threshold."""
    rng = np.random.default_rng(seed)
    samples = []
    next_pred_id = 100
    for scene_idx, scene in enumerate(("scene-0103", "scene-0916")):
        n = 7
        labels = rng.choice([CAR, CAR, PED, BUS, BARRIER], n)
        start, vel = rng.uniform(-42, 42, (n, 2)), rng.normal(0, 1.5, (n, 2))
        life = [(int(rng.integers(0, 3)), int(rng.integers(frames - 3, frames + 1))) for _ in range(n)]
        pred_ids = np.arange(next_pred_id, next_pred_id + n)
        next_pred_id += n
        for f in range(frames):
            alive = [k for k in range(n) if life[k][0] <= f < life[k][1]]
            gt_xy = np.array([start[k] + vel[k] * f for k in alive]).reshape(-1, 2)
            gt_drop = rng.random(len(alive)) < 0.1  # GT boxes missing in a frame (no points): interpolated
            if f == frames // 2 and len(alive) >= 2:  # identity swap of the first two live tracks
                a, b = alive[0], alive[1]
                pred_ids[a], pred_ids[b] = pred_ids[b], pred_ids[a]
            seen = [k for k in alive if rng.random() > 0.15]  # missed detections, gaps in predicted tracks
            p_xy = np.array([start[k] + vel[k] * f + rng.normal(0, 0.6, 2) for k in seen]).reshape(-1, 2)
            p_labels, p_ids = labels[seen], pred_ids[seen]
            fp = int(rng.integers(0, 3))
            if fp:
                p_xy = np.concatenate([p_xy, rng.uniform(-40, 40, (fp, 2))])
                p_labels = np.concatenate([p_labels, rng.choice([CAR, PED], fp)])
                p_ids = np.concatenate([p_ids, np.arange(next_pred_id, next_pred_id + fp)])
                next_pred_id += fp
            scores = rng.uniform(0.05, 1.0, len(p_xy))
            cls_scores = np.clip(scores + rng.normal(0, 0.1, len(p_xy)), 0, 1)
            samples.append(dict(scene=scene_idx, name=scene, frame=f, pred_xy=p_xy, scores=scores,
                                cls_scores=cls_scores, labels=p_labels, ids=p_ids,
                                gt_xy=gt_xy[~gt_drop], gt_labels=labels[alive][~gt_drop],
                                gt_ids=np.array(alive)[~gt_drop] + 1000 * scene_idx))
    return samples


def _devkit_tracking(samples, tmp_path):
    from nuscenes.eval.common.config import config_factory
    from nuscenes.eval.common.data_classes import EvalBoxes
    from nuscenes.eval.common.loaders import filter_eval_boxes
    from nuscenes.eval.tracking.data_classes import TrackingBox
    from nuscenes.eval.tracking.evaluate import TrackingEval
    from nuscenes.eval.tracking.loaders import create_tracks

    cfg = config_factory("tracking_nips_2019")  # first: it sets the devkit's TRACKING_NAMES that boxes check
    nusc = _Scenes({"scene-0103": 8, "scene-0916": 8})
    tracking = {"car", "pedestrian", "bus", "truck", "trailer", "motorcycle", "bicycle"}

    def box(token, xy, name, tid, score=-1.0):
        return TrackingBox(sample_token=token, translation=(float(xy[0]), float(xy[1]), 0.0), size=(1.0, 1.0, 1.0),
                           rotation=(1.0, 0.0, 0.0, 0.0), ego_translation=(float(xy[0]), float(xy[1]), 0.0),
                           num_pts=1 if score < 0 else -1, tracking_id=str(tid), tracking_name=name,
                           tracking_score=float(score))

    gt_boxes, pred_boxes = EvalBoxes(), EvalBoxes()
    for s in samples:
        token = f"{s['name']}-{s['frame']}"
        names = [DETECTION_CLASSES[c] for c in s["gt_labels"]]
        gt_boxes.add_boxes(token, [box(token, xy, n, i) for xy, n, i in zip(s["gt_xy"], names, s["gt_ids"])
                                   if n in tracking])
        order = np.argsort(-s["scores"], kind="stable")  # upstream writes tracking results above class score 0.2
        preds = [box(token, s["pred_xy"][k], DETECTION_CLASSES[s["labels"][k]], s["ids"][k], s["scores"][k])
                 for k in order if s["cls_scores"][k] >= 0.2 and DETECTION_CLASSES[s["labels"][k]] in tracking]
        pred_boxes.add_boxes(token, preds)
    gt_boxes = filter_eval_boxes(nusc, gt_boxes, cfg.class_range)
    pred_boxes = filter_eval_boxes(nusc, pred_boxes, cfg.class_range)
    evaluation = TrackingEval.__new__(TrackingEval)  # the evaluation itself, without result files on disk
    evaluation.cfg, evaluation.verbose, evaluation.output_dir, evaluation.render_classes = cfg, False, str(tmp_path), None
    evaluation.tracks_gt = create_tracks(gt_boxes, nusc, "mini_val", gt=True)
    evaluation.tracks_pred = create_tracks(pred_boxes, nusc, "mini_val", gt=False)
    metrics, _ = evaluation.evaluate()
    return metrics


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_amota_and_amotp_equal_the_devkit(seed: int, tmp_path) -> None:
    pytest.importorskip("motmetrics")  # the devkit's tracking evaluation needs it (pyproject's dev extra)
    samples = _random_tracks(seed)
    metric = TrackingMetric(DETECTION_CLASSES)
    for s in samples:
        metric.update(_boxes(s["pred_xy"]), s["scores"], s["cls_scores"], s["labels"], s["ids"], _boxes(s["gt_xy"]),
                      s["gt_labels"], s["gt_ids"], s["scene"], 0.5 + 0.5 * s["frame"])
    ours = metric.compute()
    devkit = _devkit_tracking(samples, tmp_path)
    assert ours["AMOTA"] == pytest.approx(devkit.compute_metric("amota"), abs=1e-9)
    assert ours["AMOTP"] == pytest.approx(devkit.compute_metric("amotp"), abs=1e-6)
    for name in ("car", "pedestrian", "bus"):
        theirs = devkit.compute_metric("amota", name)
        assert ours.get(f"AMOTA/{name}", float("nan")) == pytest.approx(theirs, abs=1e-9, nan_ok=True), name
    assert 0.0 < ours["AMOTA"] < 1.0  # not degenerate
