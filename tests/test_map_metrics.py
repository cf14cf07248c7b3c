"""Chamfer-distance map AP (drivebench.models.common.map_metrics) on hand-made cases."""

from __future__ import annotations

import numpy as np
import pytest

from drivebench.models.common.map_metrics import (
    CHAMFER_THRESHOLDS,
    ChamferMapAP,
    average_precision,
    chamfer_score_matrix,
    tp_fp_greedy,
)
from drivebench.polylines import resample


def line(x0, y0, x1, y1, n=20):
    return resample(np.array([[x0, y0], [x1, y1]], dtype=np.float64), n)


def ring(cx, cy, hw, hh, n=20):
    corners = np.array([[cx - hw, cy - hh], [cx + hw, cy - hh], [cx + hw, cy + hh], [cx - hw, cy + hh],
                        [cx - hw, cy - hh]])
    return resample(corners, n)


# one sample: two dividers, a crossing, a boundary
GT = np.stack([line(-10, -5, 10, -5), line(-10, 5, 10, 5), ring(0, 15, 3, 2), line(-12, -25, -12, 25)])
GT_LABELS = np.array([0, 0, 1, 2])


def ap_of(preds, scores, labels, gt=GT, gt_labels=GT_LABELS):
    metric = ChamferMapAP()
    metric.update(np.asarray(preds), np.asarray(scores, float), np.asarray(labels), gt, gt_labels)
    return metric.compute()


def test_resampling_is_by_arc_length():
    pts = resample(np.array([[0.0, 0.0], [1.0, 0.0], [1.0, 3.0]]), 5)
    np.testing.assert_allclose(pts, [[0, 0], [1, 0], [1, 1], [1, 2], [1, 3]])


def test_perfect_predictions_give_ap_one_everywhere():
    res = ap_of(GT, [0.9, 0.8, 0.7, 0.6], GT_LABELS)
    assert res["mAP"] == pytest.approx(1.0)
    for name in ("divider", "ped_crossing", "boundary"):
        for thr in (0.5, 1.0, 1.5):
            assert res[f"AP_{name}@{thr}"] == pytest.approx(1.0)


def test_reversed_or_shifted_start_predictions_still_match():
    # chamfer ignores the point order: a reversed divider and a polygon started elsewhere are perfect
    shifted_ring = np.concatenate([GT[2][7:-1], GT[2][:8]])
    preds = [GT[0][::-1], GT[1], shifted_ring, GT[3][::-1]]
    assert ap_of(preds, [0.9, 0.8, 0.7, 0.6], GT_LABELS)["mAP"] == pytest.approx(1.0)


def test_prediction_offset_by_0_7_m_counts_at_1_0_and_1_5_but_not_0_5():
    preds = GT.copy()
    preds[0] = GT[0] + np.array([0.0, 0.7])  # perpendicular shift of a straight divider: chamfer 0.7 m
    preds[1] = GT[1] + np.array([0.0, 0.7])
    res = ap_of(preds, [0.9, 0.8, 0.7, 0.6], GT_LABELS)
    assert res["AP_divider@0.5"] == pytest.approx(0.0)
    assert res["AP_divider@1.0"] == pytest.approx(1.0)
    assert res["AP_divider@1.5"] == pytest.approx(1.0)
    assert res["AP_divider"] == pytest.approx(2.0 / 3.0)
    assert res["AP_boundary@0.5"] == pytest.approx(1.0)  # other classes untouched


def test_chamfer_score_of_a_shifted_line_is_minus_the_shift():
    pred = resample(line(-10, -5, 10, -5), 100)[None] + np.array([0.0, 0.7])
    gt = resample(line(-10, -5, 10, -5), 100)[None]
    assert chamfer_score_matrix(pred, gt)[0, 0] == pytest.approx(-0.7)


def test_duplicates_are_false_positives():
    tp, fp = tp_fp_greedy(np.array([[-0.1], [-0.2]]), np.array([0.5, 0.9]), threshold=0.5)
    assert tp.tolist() == [0.0, 1.0] and fp.tolist() == [1.0, 0.0]  # the higher score takes the element
    one_divider = GT[:1], GT_LABELS[:1]
    far = GT[0] + np.array([0.0, 1.2])  # chamfer 1.2 m, scored above an exact copy
    res = ap_of([far, GT[0]], [0.9, 0.5], [0, 0], *one_divider)
    # at 1.5 m the far one is the TP and the exact copy a duplicate (FP) ranked after it: AP 1
    assert res["AP_divider@1.5"] == pytest.approx(1.0)
    # at 1.0 m the far one is an FP ranked first, then the TP: precision 1/2 at recall 1
    assert res["AP_divider@1.0"] == pytest.approx(0.5)
    res = ap_of([GT[0], GT[0], GT[0]], [0.9, 0.8, 0.7], [0, 0, 0], *one_divider)
    assert res["AP_divider@0.5"] == pytest.approx(1.0)  # duplicates after the TP cost nothing in AP


def test_greedy_matching_does_not_fall_back_to_the_second_best_element():
    # element 0 is the best match of both predictions; element 1 is close to the second one too
    scores_matrix = np.array([[-0.1, -5.0], [-0.2, -0.3]])
    tp, fp = tp_fp_greedy(scores_matrix, np.array([0.9, 0.8]), threshold=0.5)
    assert tp.tolist() == [1.0, 0.0] and fp.tolist() == [0.0, 1.0]


def test_wrong_class_and_missed_elements_lower_ap():
    res = ap_of([GT[0]], [0.9], [2])  # a divider labelled boundary
    assert res["AP_boundary@1.5"] == pytest.approx(0.0)
    assert res["AP_divider@1.5"] == pytest.approx(0.0)
    res = ap_of([GT[0]], [0.9], [0])  # one of two dividers found
    assert res["AP_divider@0.5"] == pytest.approx(0.5)


def test_flat_capped_buffers_that_do_not_touch_give_no_match():
    # two short collinear dashes 0.9 m apart: chamfer < 1.5 m, but 2 m flat-capped buffers are disjoint
    a = resample(line(0.0, 0.0, 0.1, 0.0), 100)[None]
    b = resample(line(1.0, 0.0, 1.1, 0.0), 100)[None]
    assert chamfer_score_matrix(a, b)[0, 0] == -100.0


def test_average_precision_is_the_area_under_the_monotone_envelope():
    ap = average_precision(np.array([0.5, 0.5, 1.0]), np.array([1.0, 0.5, 2.0 / 3.0]))
    assert ap == pytest.approx(0.5 * 1.0 + 0.5 * 2.0 / 3.0)
    assert average_precision(np.zeros(0), np.zeros(0)) == 0.0


def test_accumulates_over_samples_and_resets():
    metric = ChamferMapAP()
    metric.update(GT[:2], np.array([0.9, 0.8]), np.array([0, 0]), GT, GT_LABELS)
    metric.update(np.zeros((0, 20, 2)), np.zeros(0), np.zeros(0, int), GT, GT_LABELS)
    res = metric.compute()
    assert res["AP_divider@0.5"] == pytest.approx(0.5)  # 2 of 4 dividers over the two samples
    metric.reset()
    assert metric.compute()["mAP"] == 0.0


def test_scoring_only_pairs_within_the_largest_threshold_keeps_every_flag():
    # the metric scores pairs farther than 1.5 m as non-overlapping without building their buffers: on
    # zigzags, near copies, crossing and collinear elements the flags at every threshold are the full matrix's
    rng = np.random.default_rng(7)
    k = 100
    gt = np.stack([resample(GT[i], k) for i in range(len(GT))] + [resample(line(0.0, 0.0, 0.1, 0.0), k)])
    dashes = [resample(line(x, 0.0, x + 0.1, 0.0), k) for x in (0.3, 1.0, 2.5)]  # flat caps apart, chamfer < 1.5
    near = [gt[i] + rng.normal(0, s, 2) + rng.normal(0, s / 3, (k, 2)) for i in range(len(gt)) for s in (0.2, 0.6, 1.2)]
    zigzags = [resample(rng.uniform(-20, 20, (20, 2)), k) for _ in range(30)]
    pred = np.stack(dashes + near + zigzags)
    full = chamfer_score_matrix(pred, gt)
    pruned = chamfer_score_matrix(pred, gt, within=1.5)
    assert (pruned == -100.0).sum() > (full == -100.0).sum()  # it did leave far pairs out
    confidences = rng.random(len(pred))
    for threshold in CHAMFER_THRESHOLDS:
        full_flags = tp_fp_greedy(full, confidences, threshold)
        assert full_flags[0].sum() > 0
        for got, want in zip(tp_fp_greedy(pruned, confidences, threshold), full_flags):
            np.testing.assert_array_equal(got, want)
    close = full >= -1.5
    np.testing.assert_array_equal(pruned[close], full[close])  # every pair that can match keeps its score


def test_a_zero_length_element_on_a_line_has_no_buffer_to_touch():
    # a prediction collapsed to one point that lies on a ground-truth line: the lines intersect, but its flat-capped
    # buffer is empty, so upstream's pre-filter leaves the pair unscored
    gt = resample(line(-5.0, 0.0, 5.0, 0.0), 100)[None]
    point = np.repeat(np.array([[[1.0, 0.0]]]), 100, axis=1)
    assert chamfer_score_matrix(point, gt)[0, 0] == -100.0
    assert chamfer_score_matrix(point, gt, within=1.5)[0, 0] == -100.0
