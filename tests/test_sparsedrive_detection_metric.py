"""SparseDrive's nuScenes detection metric (mAP, TP errors, NDS): hand cases, and the devkit's own
evaluation (``nuscenes.eval.detection``: its range filter, ``accumulate``, ``calc_ap``, ``calc_tp``
and the NDS aggregation of ``DetectionEval.evaluate``) on a small hand-made set of boxes."""

from __future__ import annotations

import math

import numpy as np
import pytest

from drivebench.models.sparsedrive.detection_metric import (
    ATTRIBUTE_NAMES,
    DetectionMetric,
    predicted_attributes,
)
from drivebench.models.sparsedrive.model import DETECTION_CLASSES

CAR, BARRIER, PED, CONE = (DETECTION_CLASSES.index(n) for n in ("car", "barrier", "pedestrian", "traffic_cone"))


def _box(x: float, y: float, yaw: float = 0.0, wlh=(2.0, 4.0, 1.5), v=(0.0, 0.0)) -> np.ndarray:
    return np.array([x, y, -1.0, *wlh, yaw, *v])


def test_attribute_names_are_the_devkits() -> None:
    from nuscenes.eval.detection.constants import ATTRIBUTE_NAMES as DEVKIT

    assert list(ATTRIBUTE_NAMES) == DEVKIT


def test_upstream_attribute_rule() -> None:
    labels = np.array([CAR, CAR, PED, PED, CONE, DETECTION_CLASSES.index("bus")])
    velocity = np.array([[0.3, 0.0], [0.1, 0.1], [1.0, 0.0], [0.0, 0.0], [2.0, 0.0], [0.0, 0.0]])
    names = [ATTRIBUTE_NAMES[i] if i >= 0 else "" for i in predicted_attributes(labels, velocity, DETECTION_CLASSES)]
    assert names == ["vehicle.moving", "vehicle.parked", "pedestrian.moving", "pedestrian.standing", "",
                     "vehicle.stopped"]


def test_tp_errors_and_nds_by_hand() -> None:
    """One car matched 0.3 m off, 0.5 rad off, size (2, 4, 1.5) vs (2, 5, 1.5), 1 m/s off, wrong
    attribute: every recall point from 0.1 up to the reached recall (1.0) carries those errors."""
    metric = DetectionMetric(DETECTION_CLASSES)
    gt = _box(10, 0, v=(1.0, 0.0))[None]
    pred = _box(10.3, 0, yaw=0.5, wlh=(2.0, 5.0, 1.5), v=(2.0, 0.0))[None]  # moving: "vehicle.moving"
    metric.update(pred, np.array([0.9]), np.array([CAR]), gt, np.array([CAR]),
                  gt_attrs=np.array([ATTRIBUTE_NAMES.index("vehicle.parked")]))
    curve = metric.curve(CAR, 2.0)
    assert curve.tp_error("trans_err", 0.1) == pytest.approx(0.3)
    assert curve.tp_error("orient_err", 0.1) == pytest.approx(0.5)
    assert curve.tp_error("scale_err", 0.1) == pytest.approx(1 - 4 / 5)
    assert curve.tp_error("vel_err", 0.1) == pytest.approx(1.0)
    assert curve.tp_error("attr_err", 0.1) == pytest.approx(1.0)
    out = metric.compute()
    # classes without GT: AP 0 and every error 1 (the devkit's "no predictions"); cones and barriers
    # leave out the errors they do not define
    assert out["AP/car"] == pytest.approx(1.0) and out["mAP"] == pytest.approx(0.1)
    assert out["mATE"] == pytest.approx((0.3 + 9) / 10)
    assert out["mAOE"] == pytest.approx((0.5 + 8) / 9)  # cones have no AOE
    assert out["mAVE"] == pytest.approx(8 / 8)  # neither cones nor barriers
    expected = (5 * 0.1 + sum(max(0.0, 1 - out[k]) for k in ("mATE", "mASE", "mAOE", "mAVE", "mAAE"))) / 10
    assert out["NDS"] == pytest.approx(expected)


def test_gt_without_velocity_or_attribute_is_left_out_and_barrier_yaw_has_a_half_turn_period() -> None:
    metric = DetectionMetric(DETECTION_CLASSES)
    gts = np.stack([_box(0, 10, v=(1.0, 0.0)), _box(5, 10, v=(0.0, 0.0))])
    preds = np.stack([_box(0, 10, v=(1.0, 0.0)), _box(5, 10, v=(9.0, 0.0))])  # 9 m/s off where GT has none
    metric.update(preds, np.array([0.9, 0.8]), np.array([CAR, CAR]), gts, np.array([CAR, CAR]),
                  gt_velocity_valid=np.array([True, False]))
    assert metric.curve(CAR, 2.0).tp_error("vel_err", 0.1) == pytest.approx(0.0)
    assert metric.curve(CAR, 2.0).tp_error("attr_err", 0.1) == 1.0  # no GT attribute at all: the worst
    barrier = DetectionMetric(DETECTION_CLASSES)
    barrier.update(_box(0, 5, yaw=math.pi + 0.1)[None], np.array([0.9]), np.array([BARRIER]), _box(0, 5)[None],
                   np.array([BARRIER]))
    assert barrier.curve(BARRIER, 2.0).tp_error("orient_err", 0.1) == pytest.approx(0.1)


class _NoBikeRacks:
    """What the devkit's range / point / bike-rack filter reads of a NuScenes: samples without annotations."""

    def get(self, table: str, token: str) -> dict:
        assert table == "sample"
        return {"anns": []}


def _random_set(seed: int):
    """Samples of cars, pedestrians, barriers and cones with offsets, sizes, yaw, velocity (some GT
    without), attributes (some GT without), misses, false positives, tied scores, far boxes."""
    rng = np.random.default_rng(seed)
    classes = np.array([CAR, PED, BARRIER, CONE])
    samples = []
    for _ in range(8):
        n = int(rng.integers(3, 9))
        xy = rng.uniform(-45, 45, (n, 2))  # some beyond the class ranges (30 / 40 / 50 m)
        labels = rng.choice(classes, n)
        gt = np.stack([_box(x, y, yaw=rng.uniform(-math.pi, math.pi), wlh=rng.uniform(0.5, 5, 3),
                            v=rng.normal(0, 2, 2)) for x, y in xy])
        vel_valid = rng.random(n) < 0.8
        attrs = rng.integers(-1, len(ATTRIBUTE_NAMES), n)
        keep = rng.random(n) < 0.8
        pred = gt[keep].copy()
        m = len(pred)
        pred[:, :2] += rng.normal(0, 0.9, (m, 2))
        pred[:, 3:6] *= rng.uniform(0.7, 1.3, (m, 3))
        pred[:, 6] += rng.normal(0, 0.4, m)
        pred[:, 7:9] += rng.normal(0, 0.7, (m, 2))
        pred_labels = labels[keep].copy()
        extra = int(rng.integers(0, 4))
        if extra:
            pred = np.concatenate([pred, np.stack([_box(*rng.uniform(-40, 40, 2), v=rng.normal(0, 1, 2))
                                                   for _ in range(extra)])])
            pred_labels = np.concatenate([pred_labels, rng.choice(classes, extra)])
        scores = np.round(rng.random(len(pred)), 1)  # ties on purpose
        samples.append((pred, scores, pred_labels, gt, labels, attrs, vel_valid))
    return samples


def _devkit_metrics(samples):
    from pyquaternion import Quaternion

    from nuscenes.eval.common.data_classes import EvalBoxes
    from nuscenes.eval.common.loaders import filter_eval_boxes
    from nuscenes.eval.detection.config import config_factory
    from nuscenes.eval.detection.data_classes import DetectionBox
    from nuscenes.eval.detection.evaluate import DetectionEval

    def devkit_box(token, b, label, score=-1.0, attr=""):
        return DetectionBox(sample_token=token, translation=tuple(float(v) for v in b[:3]),
                            size=tuple(float(v) for v in b[3:6]),
                            rotation=tuple(Quaternion(axis=[0, 0, 1], radians=float(b[6])).elements),
                            velocity=tuple(float(v) for v in b[7:9]), ego_translation=tuple(float(v) for v in b[:3]),
                            num_pts=1 if score < 0 else -1, detection_name=DETECTION_CLASSES[int(label)],
                            detection_score=float(score), attribute_name=attr)

    gt_boxes, pred_boxes = EvalBoxes(), EvalBoxes()
    for s, (pred, scores, pred_labels, gt, labels, attrs, vel_valid) in enumerate(samples):
        token = f"sample{s}"
        gt = gt.copy()
        gt[~vel_valid, 7:9] = np.nan  # the devkit's GT velocity where it cannot be estimated
        order = np.argsort(-scores, kind="stable")  # the order the metric keeps a sample's detections in
        pred_attrs = predicted_attributes(pred_labels, pred[:, 7:9], DETECTION_CLASSES)
        gt_boxes.add_boxes(token, [devkit_box(token, b, c, attr=ATTRIBUTE_NAMES[a] if a >= 0 else "")
                                   for b, c, a in zip(gt, labels, attrs)])
        pred_boxes.add_boxes(token, [devkit_box(token, pred[i], pred_labels[i], scores[i],
                                                ATTRIBUTE_NAMES[pred_attrs[i]] if pred_attrs[i] >= 0 else "")
                                     for i in order])
    cfg = config_factory("detection_cvpr_2019")
    evaluation = DetectionEval.__new__(DetectionEval)  # the evaluation itself, without result files on disk
    evaluation.cfg, evaluation.verbose = cfg, False
    evaluation.gt_boxes = filter_eval_boxes(_NoBikeRacks(), gt_boxes, cfg.class_range)
    evaluation.pred_boxes = filter_eval_boxes(_NoBikeRacks(), pred_boxes, cfg.class_range)
    metrics, _ = evaluation.evaluate()
    return metrics


@pytest.mark.parametrize("seed", [0, 1])
def test_map_tp_errors_and_nds_equal_the_devkit(seed: int) -> None:
    samples = _random_set(seed)
    metric = DetectionMetric(DETECTION_CLASSES)
    for pred, scores, pred_labels, gt, labels, attrs, vel_valid in samples:
        metric.update(pred, scores, pred_labels, gt, labels, gt_attrs=attrs, gt_velocity_valid=vel_valid)
    ours = metric.compute()
    devkit = _devkit_metrics(samples)
    assert ours["mAP"] == pytest.approx(devkit.mean_ap, abs=1e-12)
    for name in DETECTION_CLASSES:
        assert ours[f"AP/{name}"] == pytest.approx(devkit.mean_dist_aps[name], abs=1e-12)
    for err, key in (("trans_err", "mATE"), ("scale_err", "mASE"), ("orient_err", "mAOE"), ("vel_err", "mAVE"),
                     ("attr_err", "mAAE")):
        assert ours[key] == pytest.approx(devkit.tp_errors[err], abs=1e-9), key
    assert ours["NDS"] == pytest.approx(devkit.nd_score, abs=1e-9)
    # the set is not degenerate: matches, errors below the worst value, a score between 0 and 1
    assert 0.05 < ours["NDS"] < 0.9 and 0 < ours["AP/car"] < 1
    assert 0 < metric.curve(CAR, 2.0).tp_error("trans_err", 0.1) < 1  # classes without GT count 1 in mATE
