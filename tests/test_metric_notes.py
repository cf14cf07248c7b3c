"""What a reader gets beside validation values that mislead alone: GaussianFormer's mIoU when classes
are absent from the ground truth, SparseDrive's motion errors when nothing was matched."""

from __future__ import annotations

import numpy as np
import torch

from drivebench.models.gaussianformer.metrics import OccupancyMetric
from drivebench.models.gaussianformer.metrics import metric_notes as occupancy_notes
from drivebench.models.sparsedrive.metrics import MotionMetric
from drivebench.models.sparsedrive.metrics import metric_notes as motion_notes
from drivebench.perf.summary import render_table


def test_absent_classes_score_100_as_upstream_and_the_note_gives_the_mean_over_present_ones():
    metric = OccupancyMetric()
    target = torch.tensor([4, 4, 11, 11, 17, 17])  # car and driveable surface only, besides empty
    pred = torch.tensor([17, 17, 17, 17, 17, 17])  # everything predicted empty
    metric.update(pred, target)
    values = metric.compute()
    assert values["miou"] == 100.0 * 14 / 16 and values["iou"] == 0.0  # upstream's MeanIoU: absent classes = 1
    assert values["classes_present"] == 2 and values["miou_present"] == 0.0
    notes = occupancy_notes(values)
    assert notes["miou"].startswith("2 of 16 classes in the ground truth: the 14 absent score 100")
    assert "over the 2 present: 0" in notes["miou"]
    table = render_table({"val": values, "val_notes": notes})
    assert "87.5 (2 of 16 classes" in table
    every = {**values, "classes_present": 16.0}
    assert occupancy_notes(every) == {}


def test_motion_errors_without_a_matched_detection_are_named_the_placeholder():
    metric = MotionMetric(groups={"car": (0,)})
    gt_boxes = np.zeros((1, 9))
    gt_trajs, gt_masks = np.ones((1, 6, 2)), np.ones((1, 6))
    no_scores = np.array([0.1])  # below the 0.2 that motion evaluation needs
    metric.update(np.zeros((1, 9)), no_scores, np.array([0]), np.zeros((1, 6, 6, 2)), gt_boxes, np.array([0]),
                  gt_trajs, gt_masks)
    values = metric.compute()
    assert values["motion/car_minADE"] == values["motion/car_minFDE"] == values["motion/car_MR"] == 1.0
    assert values["motion/car_matched"] == 0
    notes = motion_notes(values)
    assert set(notes) == {"motion/car_minADE", "motion/car_minFDE", "motion/car_MR"}
    assert notes["motion/car_minADE"].startswith("placeholder: no car detection")

    matched = MotionMetric(groups={"car": (0,)})
    traj = np.broadcast_to(gt_trajs[:, None], (1, 6, 6, 2)).copy()  # every mode exactly on the future
    matched.update(np.zeros((1, 9)), np.array([0.9]), np.array([0]), traj, gt_boxes, np.array([0]), gt_trajs,
                   gt_masks)
    values = matched.compute()
    assert values["motion/car_matched"] == 1 and values["motion/car_minADE"] == 0.0
    assert motion_notes(values) == {}
