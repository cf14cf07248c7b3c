"""Validation metrics under DDP: each metric's per-rank state merges into the whole set's value.

Hand-made case first: per-rank APs averaged (what ``sync_dist=True`` logs) differ from the AP of the
union, which is what one process validating everything reports. Then every mergeable metric class,
and the real all-gather across two gloo processes.
"""

from __future__ import annotations

import os
import socket

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from drivebench.lit.metric_sync import merge_across_ranks
from drivebench.models.common.map_metrics import ChamferMapAP
from drivebench.models.qcnet.metrics import MotionMetrics
from drivebench.models.sparsedrive.metrics import DetectionAP, PlanningMetric
from drivebench.models.sparsedrive.model import DETECTION_CLASSES

LINE = np.array([[0.0, 0.0], [10.0, 0.0]])
FAR = np.array([[0.0, 30.0], [10.0, 30.0]])


def _ap(samples) -> ChamferMapAP:
    metric = ChamferMapAP(("divider",), (1.0,))
    for pred_pts, scores, gt_pts in samples:
        metric.add_sample(np.asarray(pred_pts), np.asarray(scores), np.zeros(len(scores), int), np.asarray(gt_pts),
                          np.zeros(len(gt_pts), int))
    return metric


def test_merged_ap_is_the_ap_of_the_union_not_the_mean_of_rank_aps():
    rank0 = [([LINE], [0.5], [LINE])]  # a true positive at confidence 0.5
    rank1 = [([FAR], [0.9], [LINE])]  # a false positive at 0.9, its ground truth missed
    ap0, ap1 = _ap(rank0).compute()["mAP"], _ap(rank1).compute()["mAP"]
    union = _ap(rank0 + rank1).compute()["mAP"]
    merged = _ap([])
    merged.merge([_ap(rank0).state(), _ap(rank1).state()])
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
    merged = _ap([])
    merged.merge([_ap(samples[0::3]).state(), _ap(samples[1::3]).state(), _ap(samples[2::3]).state()])
    assert merged.compute() == pytest.approx(_ap(samples).compute())


def test_motion_metrics_merge_weights_ranks_by_their_agents():
    torch.manual_seed(0)
    pred, target = torch.randn(7, 6, 5, 2), torch.randn(7, 5, 2)
    valid, prob = torch.ones(7, 5, dtype=torch.bool), torch.softmax(torch.randn(7, 6), -1)
    whole, a, b = MotionMetrics(), MotionMetrics(), MotionMetrics()
    whole.update(pred, target, valid, prob)
    a.update(pred[:2], target[:2], valid[:2], prob[:2])  # 2 agents on one rank, 5 on the other
    b.update(pred[2:], target[2:], valid[2:], prob[2:])
    mean_of_ranks = 0.5 * (a.compute()["minADE"] + b.compute()["minADE"])
    merged = MotionMetrics()
    merged.merge([a.state(), b.state(), MotionMetrics().state()])  # a rank without agents gives None
    assert merged.compute() == pytest.approx(whole.compute())
    assert merged.compute()["minADE"] != pytest.approx(mean_of_ranks)


def _box(x: float, y: float) -> np.ndarray:
    return np.array([x, y, -1.0, 2.0, 4.0, 1.5, 0.0, 0.0, 0.0])


def test_detection_ap_and_planning_metric_merge():
    det = [(np.stack([_box(10, 0), _box(-20.7, 5)]), np.array([0.9, 0.8]), np.array([0, 0]),
            np.stack([_box(10, 0), _box(-20, 5)]), np.array([0, 0])),
           (np.stack([_box(3, 3)]), np.array([0.95]), np.array([0]), np.stack([_box(-8, 1)]), np.array([0]))]
    whole, parts = DetectionAP(DETECTION_CLASSES), [DetectionAP(DETECTION_CLASSES) for _ in det]
    for sample, part in zip(det, parts):
        whole.update(*sample)
        part.update(*sample)
    merged = DetectionAP(DETECTION_CLASSES)
    merged.merge([p.state() for p in parts])
    assert merged.compute() == pytest.approx(whole.compute())

    a, b = PlanningMetric(), PlanningMetric()
    a.l2, a.collision, a.total = np.arange(6.0), np.zeros(6), 2
    b.l2, b.collision, b.total = np.ones(6), np.full(6, 1.0), 3
    merged = PlanningMetric()
    merged.merge([a.state(), b.state()])
    assert merged.total == 5 and np.allclose(merged.l2, np.arange(6.0) + 1) and np.allclose(merged.collision, 1.0)


def test_without_a_process_group_nothing_is_merged():
    metric = _ap([([LINE], [0.5], [LINE])])
    assert merge_across_ranks([metric]) is False
    assert metric.compute()["mAP"] == pytest.approx(1.0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, port: int, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        mine = [([LINE], [0.5], [LINE])] if rank == 0 else [([FAR], [0.9], [LINE])]
        metric = _ap(mine)
        merged = merge_across_ranks([metric])
        results[rank] = (merged, metric.compute()["mAP"])
    finally:
        dist.destroy_process_group()


def test_two_gloo_ranks_compute_the_same_global_ap():
    union = _ap([([LINE], [0.5], [LINE]), ([FAR], [0.9], [LINE])]).compute()["mAP"]
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_rank, args=(_free_port(), results), nprocs=2, join=True)
        got = dict(results)
    assert got[0][0] is True and got[1][0] is True
    assert got[0][1] == pytest.approx(union) and got[1][1] == pytest.approx(union)


def test_occupancy_confusion_matrices_sum_over_ranks():
    from drivebench.models.gaussianformer.metrics import OccupancyMetric

    def metric():
        return OccupancyMetric(num_classes=3, semantic_classes=(0, 1), empty_label=2, class_names=("a", "b", "e"))

    torch.manual_seed(0)
    pred, target = torch.randint(0, 3, (2, 50)), torch.randint(0, 3, (2, 50))
    whole, a, b = metric(), metric(), metric()
    whole.update(pred, target)
    a.update(pred[0], target[0])
    b.update(pred[1], target[1])
    merged = metric()
    merged.merge([a.state(), b.state(), metric().state()])
    assert torch.equal(merged.confusion_matrix(), whole.confusion_matrix())
    assert merged.compute() == pytest.approx(whole.compute())
