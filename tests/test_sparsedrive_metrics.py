"""SparseDrive metrics on hand-made cases, and detection AP against the nuScenes devkit."""

from __future__ import annotations

import math

import numpy as np
import pytest
import shapely
import torch

from drivebench.models.common.map_metrics import ChamferMapAP
from drivebench.models.sparsedrive.boxes import box_corners_2d, boxes_overlap_bev
from drivebench.models.sparsedrive.decode import decode_map, decode_planning
from drivebench.models.sparsedrive.detection_metric import DetectionMetric
from drivebench.models.sparsedrive.metrics import MotionMetric, PlanningMetric, constant_velocity_plan
from drivebench.models.sparsedrive.model import DETECTION_CLASSES, MAP_CLASSES
from drivebench.models.sparsedrive.motion import MotionPlanOutput
from drivebench.models.sparsedrive.sparse_head import HeadOutput


def _box(x: float, y: float, yaw: float = 0.0, w: float = 2.0, l: float = 4.0) -> np.ndarray:
    return np.array([x, y, -1.0, w, l, 1.5, yaw, 0.0, 0.0])


# ---- detection AP ------------------------------------------------------------------------------
def test_detection_ap_hand_cases() -> None:
    metric = DetectionMetric(DETECTION_CLASSES)
    gt = np.stack([_box(10, 0), _box(-20, 5)])
    gt_labels = np.array([0, 0])
    # one exact car, one car 0.7 m off: a match at 1, 2, 4 m but not at 0.5 m
    pred = np.stack([_box(10, 0), _box(-20.7, 5)])
    metric.update(pred, np.array([0.9, 0.8]), np.array([0, 0]), gt, gt_labels)
    ap = {th: metric.class_ap(0, th) for th in metric.dist_ths}
    assert ap[1.0] == ap[2.0] == ap[4.0] == pytest.approx(1.0)
    # at 0.5 m: precision 1 below recall 0.5, 0.5 at recall 0.5 (TP then FP), 0 above. Over the 90
    # recall bins after min recall 0.1 (11..100) minus min precision 0.1: 39 x 0.9 + 0.4
    assert ap[0.5] == pytest.approx((39 * 0.9 + 0.4) / 90 / 0.9, rel=1e-9)
    out = metric.compute()
    assert out["AP/car"] == pytest.approx(np.mean(list(ap.values())))
    assert out["mAP"] == pytest.approx(out["AP/car"] / 10)  # classes without GT count as 0, as the devkit
    assert out["AP/pedestrian"] == 0.0


def test_detection_class_range_and_wrong_class() -> None:
    metric = DetectionMetric(DETECTION_CLASSES)
    far_ped = _box(45.0, 0.0)  # pedestrians count up to 40 m
    metric.update(np.stack([far_ped, _box(5, 5)]), np.array([0.9, 0.9]), np.array([8, 1]),
                  np.stack([far_ped, _box(5, 5)]), np.array([8, 0]))
    assert metric.compute()["AP/pedestrian"] == 0.0  # the GT was filtered out: no positives
    assert metric.class_ap(0, 4.0) == 0.0  # the truck prediction does not match the car


def test_detection_ap_equals_the_devkit() -> None:
    from nuscenes.eval.common.data_classes import EvalBoxes
    from nuscenes.eval.common.utils import center_distance
    from nuscenes.eval.detection.algo import accumulate, calc_ap
    from nuscenes.eval.detection.data_classes import DetectionBox

    rng = np.random.default_rng(0)
    metric = DetectionMetric(DETECTION_CLASSES)
    gt_boxes, pred_boxes = EvalBoxes(), EvalBoxes()
    for s in range(6):
        token = f"sample{s}"
        n = int(rng.integers(2, 8))
        gt = np.stack([_box(*rng.uniform(-25, 25, 2)) for _ in range(n)])
        gt_labels = rng.choice([0, 8], n)
        keep = rng.random(n) < 0.8
        pred = gt[keep].copy()
        pred[:, :2] += rng.normal(0, 0.8, (len(pred), 2))
        pred_labels = gt_labels[keep].copy()
        extra = int(rng.integers(0, 4))
        pred = np.concatenate([pred, np.stack([_box(*rng.uniform(-25, 25, 2)) for _ in range(extra)])]) if extra else pred
        pred_labels = np.concatenate([pred_labels, rng.choice([0, 8], extra)])
        scores = np.round(rng.random(len(pred)), 1)  # ties on purpose
        metric.update(pred, scores, pred_labels, gt, gt_labels)

        def devkit_box(b, label, score=-1.0):
            return DetectionBox(sample_token=token, translation=tuple(float(v) for v in b[:3]),
                                size=tuple(float(v) for v in b[3:6]), rotation=(1.0, 0.0, 0.0, 0.0),
                                detection_name=DETECTION_CLASSES[int(label)], detection_score=float(score))

        gt_boxes.add_boxes(token, [devkit_box(b, c) for b, c in zip(gt, gt_labels)])
        pred_boxes.add_boxes(token, [devkit_box(b, c, sc) for b, c, sc in zip(pred, pred_labels, scores)])
    for cls in (0, 8):
        for th in (0.5, 1.0, 2.0, 4.0):
            md = accumulate(gt_boxes, pred_boxes, DETECTION_CLASSES[cls], center_distance, th)
            assert metric.class_ap(cls, th) == pytest.approx(calc_ap(md, 0.1, 0.1), abs=1e-12)


# ---- map AP (shared chamfer AP) through SparseDrive's decoder ------------------------------------
def test_map_ap_of_decoded_predictions() -> None:
    xs = np.linspace(-10, 10, 20)
    gt = np.stack([np.stack([xs, np.full(20, 3.0)], -1), np.stack([np.full(20, 5.0), xs], -1)])
    gt_labels = np.array([0, 2])
    logits = torch.full((1, 3, 3), -6.0)
    logits[0, 0, 0], logits[0, 1, 2] = 5.0, 4.0
    pts = torch.zeros(1, 3, 40)
    pts[0, 0] = torch.from_numpy(gt[0]).float().flatten()
    pts[0, 1] = torch.from_numpy(gt[1] + np.array([0.0, 0.0])).float().flip(0).flatten()
    pts[0, 2] = torch.from_numpy(gt[0] + np.array([0.0, 8.0])).float().flatten()  # a stray line
    elements = decode_map(HeadOutput([logits], [pts]))
    metric = ChamferMapAP(MAP_CLASSES)
    metric.update(elements.points[0].numpy(), elements.scores[0].numpy(), elements.labels[0].numpy(), gt, gt_labels)
    out = metric.compute()
    assert out["AP_divider"] == pytest.approx(1.0)
    assert out["AP_boundary"] == pytest.approx(1.0)
    assert out["AP_ped_crossing"] == 0.0


# ---- motion ------------------------------------------------------------------------------------
def test_motion_metric_hand_case() -> None:
    metric = MotionMetric()
    gt_box = _box(10, 0)[None]
    gt_traj = np.stack([np.arange(1, 13) * 1.0, np.zeros(12)], -1)[None]  # 1 m per step along x
    mask = np.ones((1, 12), dtype=bool)
    mask[0, 8:] = False  # only 8 future steps annotated
    modes = np.zeros((1, 6, 12, 2))
    modes[0, :] = gt_box[0, :2]  # every mode stays put ...
    modes[0, 3, :, 0] += np.arange(1, 13) + 0.5  # ... but mode 3 follows the GT 0.5 m ahead
    metric.update(gt_box, np.array([0.9]), np.array([1]), modes, gt_box, np.array([0]), gt_traj, mask)
    out = metric.compute()
    assert out["motion/car_minADE"] == pytest.approx(0.5)
    assert out["motion/car_minFDE"] == pytest.approx(0.5)
    assert out["motion/car_MR"] == 0.0
    assert out["motion/car_EPA"] == pytest.approx(1.0)
    # predictions below the score threshold are not evaluated; an unmatched GT lowers EPA only
    metric.update(gt_box, np.array([0.1]), np.array([1]), modes, gt_box, np.array([0]), gt_traj, mask)
    assert metric.compute()["motion/car_EPA"] == pytest.approx(0.5)
    miss = MotionMetric()
    far = modes.copy()
    far[0, 3] += np.array([0.0, 3.0])  # 3 m lateral error everywhere: a miss
    miss.update(gt_box, np.array([0.9]), np.array([1]), far, gt_box, np.array([0]), gt_traj, mask)
    assert miss.compute()["motion/car_MR"] == 1.0


# ---- planning ----------------------------------------------------------------------------------
def test_boxes_overlap_agrees_with_shapely() -> None:
    rng = np.random.default_rng(1)
    a = torch.tensor(np.stack([_box(*rng.uniform(-4, 4, 2), rng.uniform(-3, 3), *rng.uniform(0.5, 4, 2)) for _ in range(300)]))
    b = torch.tensor(np.stack([_box(*rng.uniform(-4, 4, 2), rng.uniform(-3, 3), *rng.uniform(0.5, 4, 2)) for _ in range(300)]))
    ours = boxes_overlap_bev(a, b).numpy()
    pa = shapely.polygons(box_corners_2d(a).numpy())
    pb = shapely.polygons(box_corners_2d(b).numpy())
    assert (ours == shapely.intersects(pa, pb)).all()
    assert 0 < ours.sum() < len(ours)


def _turn(xy: np.ndarray, angle: float) -> np.ndarray:
    c, s = math.cos(angle), math.sin(angle)
    return np.stack([xy[..., 0] * c - xy[..., 1] * s, xy[..., 0] * s + xy[..., 1] * c], -1)


@pytest.mark.parametrize("forward_yaw", [0.0, math.pi / 2])  # an x-forward frame and nuScenes' LIDAR_TOP
def test_planning_l2_and_collision_hand_case(forward_yaw: float) -> None:
    # the case in ego coordinates (x forward), turned into the lidar frame
    metric = PlanningMetric(forward_yaw=forward_yaw)
    gt_plan = _turn(np.stack([np.arange(1, 7) * 2.0, np.zeros(6)], -1), forward_yaw)  # straight ahead, 4 m/s
    plan = gt_plan + _turn(np.array([0.0, 1.0]), forward_yaw)  # 1 m to the left at every step
    mask = np.ones(6, dtype=bool)
    # a parked car ahead on the left lane, in the plan's way from the 4th step but not the GT's
    parked = _box(11.0, 2.5, w=2.0, l=4.0)[None]  # spans x 9..13, y 1.5..3.5
    parked[:, :2] = _turn(parked[:, :2], forward_yaw)
    parked[:, 6] += forward_yaw
    metric.update(plan, gt_plan, mask, parked, np.zeros((1, 6, 2)), np.ones((1, 6), dtype=bool))
    out = metric.compute()
    assert out["plan/L2_1s"] == out["plan/L2_2s"] == out["plan/L2_3s"] == pytest.approx(1.0)
    per_step = metric.collision / metric.total
    # the ego box (4.084 m long, 0.5 m ahead of the plan point) reaches x = 9 from the 4th step on
    assert per_step.tolist() == [0, 0, 0, 1, 1, 1]
    assert out["plan/col_1s"] == 0.0 and out["plan/col_2s"] == 0.25 and out["plan/col_3s"] == 0.5
    # incomplete ego futures are skipped
    metric.update(plan, gt_plan, np.array([True] * 5 + [False]), parked, np.zeros((1, 6, 2)), np.ones((1, 6), dtype=bool))
    assert metric.total == 1
    # the same collision when the GT path collides too does not count
    both = PlanningMetric(forward_yaw=forward_yaw)
    both.update(plan, plan, mask, parked, np.zeros((1, 6, 2)), np.ones((1, 6), dtype=bool))
    assert both.compute()["plan/col_avg"] == 0.0
    # a car that moves out of the way (GT future) is no collision
    moving = PlanningMetric(forward_yaw=forward_yaw)
    away = _turn(np.stack([np.zeros(6), np.arange(1, 7) * 3.0], -1), forward_yaw)[None]  # 3 m/step to the left
    moving.update(plan, gt_plan, mask, parked, away, np.ones((1, 6), dtype=bool))
    assert moving.compute()["plan/col_avg"] == 0.0


def test_constant_velocity_plan_turns_the_can_bus_velocity_into_the_lidar_frame() -> None:
    # nuScenes' LIDAR_TOP: yawed -90 deg on the ego, so ego x (forward) is lidar +y
    lidar2ego = np.eye(4)
    lidar2ego[:3, :3] = [[0.0, 1.0, 0.0], [-1.0, 0.0, 0.0], [0.0, 0.0, 1.0]]
    status = np.zeros(10)
    status[6:9] = [4.0, 0.5, 0.0]  # 4 m/s forward, 0.5 m/s to the left
    cv = constant_velocity_plan(status, lidar2ego)
    np.testing.assert_allclose(cv[0], [-0.25, 2.0])          # left is lidar -x, forward lidar +y, after 0.5 s
    np.testing.assert_allclose(cv[-1], 6 * cv[0])
    metric = PlanningMetric(forward_yaw=math.pi / 2)
    gt = np.stack([np.zeros(6), np.arange(1, 7) * 2.0], -1)  # straight ahead at 4 m/s
    metric.update(gt, gt, np.ones(6, dtype=bool), np.zeros((0, 9)), np.zeros((0, 6, 2)), np.zeros((0, 6), bool), cv)
    out = metric.compute()
    # the cv plan drifts 0.25 m left per step: mean L2 over steps 1-2, 1-4, 1-6
    assert out["plan/cv_L2_1s"] == pytest.approx(0.375) and out["plan/cv_L2_3s"] == pytest.approx(0.875)
    assert out["plan/cv_L2_avg"] == pytest.approx((0.375 + 0.625 + 0.875) / 3) and out["plan/L2_avg"] == 0.0
    without = PlanningMetric()
    without.update(gt, gt, np.ones(6, dtype=bool), np.zeros((0, 9)), np.zeros((0, 6, 2)), np.zeros((0, 6), bool))
    assert not any(k.startswith("plan/cv_") for k in without.compute())


def test_planning_decoder_takes_the_command_and_avoids_collisions() -> None:
    reg = torch.zeros(1, 1, 18, 6, 2)
    reg[..., 0] = 1.0  # every mode: 1 m per step straight ahead ...
    reg[0, 0, 6:12, :, 1] = torch.arange(6.0)[:, None]  # ... "turn left" mode m drifts m metres left per step
    cls = torch.zeros(1, 1, 18)
    cls[0, 0, 7] = 3.0  # best left mode
    cls[0, 0, 15] = 5.0  # best straight mode (higher, but not commanded)
    motion = MotionPlanOutput(plan_cls=[cls], plan_reg=[reg], motion_cls=[torch.zeros(1, 1, 6)],
                              motion_reg=[torch.zeros(1, 1, 6, 12, 2)], plan_status=[torch.zeros(1, 1, 10)])
    left = torch.tensor([[0.0, 1.0, 0.0]])
    plan, scores = decode_planning(motion, left, rescore=False, forward_yaw=0.0)
    path = reg[0, 0, 7].cumsum(0)
    torch.testing.assert_close(plan[0], path)
    # a confident static obstacle just ahead of mode 7's last point: rescoring drops that mode
    from drivebench.models.sparsedrive.decode import Detections

    obstacle = torch.tensor([[[float(path[5, 0]) + 0.5, float(path[5, 1]), -1.0, 0.5, 0.5, 1.5, 0.0, 0.0, 0.0]]])
    dets = Detections(obstacle, torch.tensor([[0.9]]), torch.tensor([[0.9]]), torch.tensor([[0]]), torch.tensor([[0]]))
    plan2, scores2 = decode_planning(motion, left, dets, rescore=True, forward_yaw=0.0)
    assert scores2[0, 1] < -900 and (scores2[0] > -900).any()
    assert not torch.allclose(plan2[0], path)
    # a low-confidence obstacle is ignored
    dets.cls_scores[:] = 0.3
    plan3, _ = decode_planning(motion, left, dets, rescore=True, forward_yaw=0.0)
    torch.testing.assert_close(plan3[0], path)
