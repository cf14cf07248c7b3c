"""Validation metrics under DDP: each metric is a torchmetrics ``Metric`` whose states (sums, or the
per-prediction records an AP ranks) torchmetrics merges, so every rank computes the whole set's value.

Hand-made case first: per-rank APs averaged (what ``sync_dist=True`` logs) differ from the AP of the
union, which is what one process validating everything reports. Then every metric class through
torchmetrics' ``merge_state`` (the ``add_state`` reductions), and the real all-gather inside
``compute()`` across two gloo processes.
"""

from __future__ import annotations

import os
import socket

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from drivebench.models.common.map_metrics import ChamferMapAP
from drivebench.models.gaussianformer.metrics import OccupancyMetric
from drivebench.models.qcnet.metrics import MotionMetrics
from drivebench.models.sparsedrive.detection_metric import DetectionMetric
from drivebench.models.sparsedrive.metrics import MotionMetric, PlanningMetric
from drivebench.models.sparsedrive.model import DETECTION_CLASSES
from drivebench.models.sparsedrive.tracking_metric import TrackingMetric

# a metric that only received merged states was never update()d: torchmetrics warns, harmlessly here
pytestmark = pytest.mark.filterwarnings("ignore:The ``compute`` method of metric")

LINE = np.array([[0.0, 0.0], [10.0, 0.0]])
FAR = np.array([[0.0, 30.0], [10.0, 30.0]])


def _ap(samples) -> ChamferMapAP:
    metric = ChamferMapAP(("divider",), (1.0,))
    for pred_pts, scores, gt_pts in samples:
        metric.update(np.asarray(pred_pts), np.asarray(scores), np.zeros(len(scores), int), np.asarray(gt_pts),
                      np.zeros(len(gt_pts), int))
    return metric


def _merged(into, parts):
    """``into`` (a fresh metric) with every part's state merged in, by torchmetrics' own reductions."""
    for part in parts:
        into.merge_state(part)
    return into


def test_merged_ap_is_the_ap_of_the_union_not_the_mean_of_rank_aps():
    rank0 = [([LINE], [0.5], [LINE])]  # a true positive at confidence 0.5
    rank1 = [([FAR], [0.9], [LINE])]  # a false positive at 0.9, its ground truth missed
    ap0, ap1 = _ap(rank0).compute()["mAP"], _ap(rank1).compute()["mAP"]
    union = _ap(rank0 + rank1).compute()["mAP"]
    merged = _merged(_ap([]), [_ap(rank0), _ap(rank1)])
    assert merged.compute()["mAP"] == pytest.approx(union)
    assert (ap0, ap1) == (pytest.approx(1.0), 0.0)
    assert union < 0.5 * (ap0 + ap1) - 0.1  # the FP outranks the TP: averaging rank APs overstates it


def test_merged_ap_equals_one_process_on_random_samples():
    rng = np.random.default_rng(0)
    samples = []
    for _ in range(10):
        gts = rng.uniform(-20, 20, size=(3, 5, 2))
        preds = gts[:2] + rng.normal(0, 0.6, size=(2, 5, 2))
        samples.append((np.concatenate([preds, rng.uniform(-20, 20, size=(2, 5, 2))]), rng.uniform(0, 1, 4), gts))
    merged = _merged(_ap([]), [_ap(samples[0::3]), _ap(samples[1::3]), _ap(samples[2::3])])
    whole = _ap(samples).compute()
    assert merged.compute() == pytest.approx(whole)
    assert 0.0 < whole["mAP"] < 1.0


def test_motion_metrics_merge_weights_ranks_by_their_agents():
    torch.manual_seed(0)
    pred, target = torch.randn(7, 6, 5, 2), torch.randn(7, 5, 2)
    valid, prob = torch.ones(7, 5, dtype=torch.bool), torch.softmax(torch.randn(7, 6), -1)
    whole, a, b = MotionMetrics(), MotionMetrics(), MotionMetrics()
    whole.update(pred, target, valid, prob)
    a.update(pred[:2], target[:2], valid[:2], prob[:2])  # 2 agents on one rank, 5 on the other
    b.update(pred[2:], target[2:], valid[2:], prob[2:])
    mean_of_ranks = 0.5 * (a.compute()["minADE"] + b.compute()["minADE"])
    merged = _merged(MotionMetrics(), [a, b, MotionMetrics()])  # a rank without agents adds nothing
    assert merged.compute() == pytest.approx(whole.compute())
    assert merged.count == 7
    assert merged.compute()["minADE"] != pytest.approx(mean_of_ranks)


def _box(x: float, y: float) -> np.ndarray:
    return np.array([x, y, -1.0, 2.0, 4.0, 1.5, 0.0, 0.0, 0.0])


DETECTIONS = [(np.stack([_box(10, 0), _box(-20.7, 5)]), np.array([0.9, 0.8]), np.array([0, 0]),
               np.stack([_box(10, 0), _box(-20, 5)]), np.array([0, 0])),
              (np.stack([_box(3, 3)]), np.array([0.95]), np.array([0]), np.stack([_box(-8, 1)]), np.array([0])),
              (np.zeros((0, 9)), np.zeros(0), np.zeros(0, int), np.stack([_box(1, 1)]), np.array([8]))]


def test_detection_ap_and_planning_metric_merge():
    whole, parts = DetectionMetric(DETECTION_CLASSES), [DetectionMetric(DETECTION_CLASSES) for _ in DETECTIONS]
    for sample, part in zip(DETECTIONS, parts):
        whole.update(*sample)
        part.update(*sample)
    merged = _merged(DetectionMetric(DETECTION_CLASSES), parts)
    assert merged.num_samples == 3
    assert merged.compute() == pytest.approx(whole.compute())
    assert 0.0 < whole.compute()["AP/car"] < 1.0

    a, b = PlanningMetric(), PlanningMetric()
    a.l2, a.collision, a.total = torch.arange(6.0, dtype=torch.float64), torch.zeros(6, dtype=torch.float64), \
        torch.tensor(2)
    b.l2, b.collision, b.total = torch.ones(6, dtype=torch.float64), torch.ones(6, dtype=torch.float64), \
        torch.tensor(3)
    merged = _merged(PlanningMetric(), [a, b])
    assert int(merged.total) == 5
    assert torch.allclose(merged.l2, torch.arange(6.0, dtype=torch.float64) + 1)
    assert torch.allclose(merged.collision, torch.ones(6, dtype=torch.float64))


def _motion_samples() -> list[tuple]:
    rng = np.random.default_rng(3)
    out = []
    for n in (2, 0, 3):
        boxes = np.stack([_box(*rng.uniform(-20, 20, 2)) for _ in range(n)]) if n else np.zeros((0, 9))
        gt_traj = rng.normal(0, 1, (n, 12, 2)).cumsum(1)
        modes = boxes[:, None, None, :2] + gt_traj[:, None] + rng.normal(0, 0.5, (n, 6, 12, 2))
        mask = rng.random((n, 12)) < 0.9
        out.append((boxes, rng.uniform(0.3, 1, n), np.zeros(n, int), modes, boxes, np.zeros(n, int), gt_traj, mask))
    return out


def _tracking_samples() -> list[tuple]:
    """Two scenes of two cars each over 4 frames, tracked with noise and one identity swap in scene 1;
    the streaming sampler gives a scene to one rank, and may replay a frame on it."""
    rng = np.random.default_rng(5)
    out = []
    for scene in (0, 1):
        start = rng.uniform(-20, 20, (2, 2))
        for t in range(4):
            gt = start + np.array([1.0, 0.0]) * t
            ids = np.array([10, 11]) if scene == 0 or t < 2 else np.array([11, 10])
            pred = gt + rng.normal(0, 0.3, gt.shape)
            boxes = np.concatenate([pred, np.zeros((2, 7))], 1)
            gt_boxes = np.concatenate([gt, np.zeros((2, 7))], 1)
            scores = rng.uniform(0.3, 1.0, 2)
            out.append((boxes, scores, scores, np.zeros(2, int), ids, gt_boxes, np.zeros(2, int), np.array([1, 2]),
                        scene, 0.5 * t))
    return out


def test_tracking_metric_merge_counts_a_replayed_sample_once():
    samples = _tracking_samples()
    whole, rank0, rank1 = TrackingMetric(DETECTION_CLASSES), TrackingMetric(DETECTION_CLASSES), TrackingMetric(DETECTION_CLASSES)
    for sample in samples:
        whole.update(*sample)
    for sample in samples[:4]:
        rank0.update(*sample)
    for sample in samples[4:] + samples[4:5]:  # scene 1 with its first frame replayed
        rank1.update(*sample)
    merged = _merged(TrackingMetric(DETECTION_CLASSES), [rank0, rank1])
    assert merged.num_samples == 9
    assert merged.compute() == pytest.approx(whole.compute())
    assert 0.0 < whole.compute()["AMOTA"] < 1.0


def test_sparsedrive_motion_metric_merge():
    whole, parts = MotionMetric(), [MotionMetric() for _ in range(3)]
    for sample, part in zip(_motion_samples(), parts):
        whole.update(*sample)
        part.update(*sample)
    merged = _merged(MotionMetric(), parts)
    assert merged.compute() == pytest.approx(whole.compute())
    assert whole.compute()["motion/car_minADE"] > 0


def test_occupancy_confusion_matrices_sum_over_ranks():
    def metric():
        return OccupancyMetric(num_classes=3, semantic_classes=(0, 1), empty_label=2, class_names=("a", "b", "e"))

    torch.manual_seed(0)
    pred, target = torch.randint(0, 3, (2, 50)), torch.randint(0, 3, (2, 50))
    whole, a, b = metric(), metric(), metric()
    whole.update(pred, target)
    a.update(pred[0], target[0])
    b.update(pred[1], target[1])
    merged = _merged(metric(), [a, b, metric()])
    assert torch.equal(merged.confusion_matrix(), whole.confusion_matrix())
    assert merged.compute() == pytest.approx(whole.compute())


def test_metric_states_are_not_in_the_module_state_dict():
    """Metrics on a LightningModule are submodules: their states must not change a checkpoint's keys."""
    holder = torch.nn.Module()
    holder.ap = _ap([([LINE], [0.5], [LINE])])
    holder.occupancy = OccupancyMetric(num_classes=3, semantic_classes=(0, 1), empty_label=2)
    holder.planning = PlanningMetric()
    holder.linear = torch.nn.Linear(2, 2)
    assert sorted(holder.state_dict()) == ["linear.bias", "linear.weight"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, port: int, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        mine = [([LINE], [0.5], [LINE])] if rank == 0 else [([FAR], [0.9], [LINE])]
        ap = _ap(mine)
        detection = DetectionMetric(DETECTION_CLASSES)
        for sample in DETECTIONS[:2] if rank == 0 else DETECTIONS[2:]:  # uneven shares: 2 samples and 1
            detection.update(*sample)
        motion = MotionMetric()
        for sample in _motion_samples()[:1] if rank == 0 else _motion_samples()[1:]:
            motion.update(*sample)
        tracking = TrackingMetric(DETECTION_CLASSES)
        for sample in _tracking_samples()[:4] if rank == 0 else _tracking_samples()[4:]:  # a scene per rank
            tracking.update(*sample)
        results[rank] = (ap.compute()["mAP"], detection.compute(), motion.compute(), detection.num_samples,
                         tracking.compute())
    finally:
        dist.destroy_process_group()


def test_two_gloo_ranks_compute_the_same_global_values():
    union = _ap([([LINE], [0.5], [LINE]), ([FAR], [0.9], [LINE])]).compute()["mAP"]
    detection, motion, tracking = DetectionMetric(DETECTION_CLASSES), MotionMetric(), TrackingMetric(DETECTION_CLASSES)
    for sample in DETECTIONS:
        detection.update(*sample)
    for sample in _tracking_samples():
        tracking.update(*sample)
    for sample in _motion_samples():
        motion.update(*sample)
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_rank, args=(_free_port(), results), nprocs=2, join=True)
        got = dict(results)
    for rank in (0, 1):
        ap, det, mot, local_samples, trk = got[rank]
        assert ap == pytest.approx(union)
        assert trk == pytest.approx(tracking.compute()) and "AMOTA" in trk
        assert det == pytest.approx(detection.compute())
        assert mot == pytest.approx(motion.compute())
        assert local_samples == (2 if rank == 0 else 1)  # compute() restores the rank's own state
