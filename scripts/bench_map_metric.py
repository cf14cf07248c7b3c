"""Host time of the chamfer map AP's per-sample matching (MapTR and SparseDrive validations): upstream's order
(every element buffered, an STRtree query of the buffers, the chamfer of each intersecting pair; drivebench's
metric until 2026-12-07) against ``ChamferMapAP``'s since, which scores and buffers only the pairs within the
largest threshold (the same true-positive flags; ``tests/test_map_metrics.py``).

The work runs in the validation's metric update on the training process's host thread, where a GPU waits for
it: SparseDrive ``small`` updates two samples a batch, and its untrained model's zigzag elements made each
sample's update ~100 ms of shapely buffers on the project's CPU. Synthetic samples, three kinds:
``zigzag`` (100 elements of 20 random points, as an untrained head predicts), ``near`` (noisy copies of the
ground truth, as a trained one does) and ``far`` (the ground truth moved 30 m). Prints the median and p10-p90
milliseconds per sample of each way and their ratio, and checks that the flags agree.

    python scripts/bench_map_metric.py                # 20 samples of each kind, 3 rounds
    python scripts/bench_map_metric.py --samples 50 --rounds 5

``--model`` times a real model's whole validation metric update instead: the model untrained (its initial
weights) on the embedded bench set's validation split, each batch updated with both scorers in turn:

    python scripts/bench_map_metric.py --model maptr --size nano
    python scripts/bench_map_metric.py --model sparsedrive --size small --batches 4   # ~17 s a CPU forward
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import shapely

from drivebench.models.common import map_metrics
from drivebench.models.common.map_metrics import MAP_CLASSES
from drivebench.polylines import resample

CURRENT = map_metrics.chamfer_score_matrix


def upstream_order(pred: np.ndarray, gt: np.ndarray, within: float = float("inf")) -> np.ndarray:
    """The score matrix as upstream builds it: buffers of all elements, then the chamfer of intersecting pairs
    (``within`` is taken and ignored: upstream scores every pair)."""
    scores = np.full((len(pred), len(gt)), -100.0)
    if len(pred) == 0 or len(gt) == 0:
        return scores
    pred_buf = shapely.buffer(shapely.linestrings(pred), 2.0, cap_style="flat", join_style="mitre")
    gt_buf = shapely.buffer(shapely.linestrings(gt), 2.0, cap_style="flat", join_style="mitre")
    gt_i, pred_i = shapely.STRtree(pred_buf).query(gt_buf, predicate="intersects")
    for start in range(0, len(gt_i), 256):
        g, p = gt_i[start:start + 256], pred_i[start:start + 256]
        dist = np.linalg.norm(pred[p][:, :, None, :] - gt[g][:, None, :, :], axis=-1)
        scores[p, g] = -(dist.min(axis=2).mean(axis=1) + dist.min(axis=1).mean(axis=1)) / 2.0
    return scores


def ground_truth(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A sample's map: 12 elements, straight or bent, 20 points each, over a 60 x 30 m area."""
    elements = []
    for _ in range(12):
        start, bend, end = rng.uniform([-30, -15], [30, 15], (3, 2))
        elements.append(resample(np.stack([start, bend, end]), 20))
    return np.stack(elements), rng.integers(0, len(MAP_CLASSES), 12)


def predictions(kind: str, gt: np.ndarray, gt_labels: np.ndarray, rng: np.random.Generator
                ) -> tuple[np.ndarray, np.ndarray]:
    if kind == "zigzag":
        return rng.uniform([-30, -15], [30, 15], (100, 20, 2)), rng.integers(0, len(MAP_CLASSES), 100)
    pick = rng.integers(0, len(gt), 100)
    shift = 30.0 if kind == "far" else 0.0
    pts = gt[pick] + shift + rng.normal(0, 0.5, (100, 1, 2)) + rng.normal(0, 0.15, (100, gt.shape[1], 2))
    return pts, gt_labels[pick]


def update(sample: tuple, scorer) -> np.ndarray:
    """One sample through ``ChamferMapAP.update`` with ``scorer`` as its score matrix; its flags at every threshold."""
    pred, labels, gt, gt_labels, confidences = sample
    map_metrics.chamfer_score_matrix = scorer
    try:
        metric = map_metrics.ChamferMapAP()
        metric.update(pred, confidences, labels, gt, gt_labels)
    finally:
        map_metrics.chamfer_score_matrix = CURRENT
    return metric.concatenated("tp")


def model_updates(model: str, size: str, batches: int | None) -> None:
    """A real model's ``update_metrics`` per validation batch with each scorer; per-validation totals (each batch
    enters the metric states twice: only the times are read)."""
    import tempfile
    from pathlib import Path

    import torch

    from drivebench.app import build_run
    from drivebench.compose import compose

    overrides = [f"model={model}", f"model.size={size}", "data.size=bench", "accel=none"]
    if model == "sparsedrive":
        overrides.append("model.module.anchors=default")  # no k-means: an untrained model either way
    with tempfile.TemporaryDirectory() as out:
        run = build_run(compose(overrides), Path(out), progress=False)
        data, module = run.datamodule, run.module
        data.prepare_data()
        data.setup("validate")
        module.eval()
        times: dict[str, list[float]] = {"upstream": [], "within 1.5 m": []}
        samples = 0
        with torch.no_grad():
            for i, batch in enumerate(data.val_dataloader()):
                if batches is not None and i >= batches:
                    break
                outputs = module(batch)
                samples += module.batch_size(batch)
                for way, scorer in (("upstream", upstream_order), ("within 1.5 m", CURRENT)):
                    map_metrics.chamfer_score_matrix = scorer
                    try:
                        start = time.perf_counter()
                        module.update_metrics(batch, outputs)
                        times[way].append(time.perf_counter() - start)
                    finally:
                        map_metrics.chamfer_score_matrix = CURRENT
    for way, values in times.items():
        print(f"{model} {size} {way:12s} {1000 * statistics.median(values):7.1f} ms a batch (median of "
              f"{len(values)}), {sum(values):.2f} s over {samples} samples")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=20, help="samples of each kind per round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (each times both ways on the same samples)")
    parser.add_argument("--model", choices=("maptr", "sparsedrive"), help="a real model's metric updates instead")
    parser.add_argument("--size", default="nano", help="with --model: model.size")
    parser.add_argument("--batches", type=int, help="with --model: validation batches (default: the whole split)")
    args = parser.parse_args()
    if args.model:
        model_updates(args.model, args.size, args.batches)
        return
    ways = {"upstream": upstream_order, "within 1.5 m": CURRENT}
    for kind in ("zigzag", "near", "far"):
        rng = np.random.default_rng(0)
        samples = []
        for _ in range(args.samples):
            gt, gt_labels = ground_truth(rng)
            pred, labels = predictions(kind, gt, gt_labels, rng)
            samples.append((pred, labels, gt, gt_labels, rng.random(len(pred))))
        times: dict[str, list[float]] = {way: [] for way in ways}
        for _ in range(args.rounds):
            flags = {}
            for way, scorer in ways.items():  # interleaved: both ways in every round
                for i, sample in enumerate(samples):
                    start = time.perf_counter()
                    flags[way, i] = update(sample, scorer)
                    times[way].append(1000 * (time.perf_counter() - start))
            for i in range(len(samples)):
                np.testing.assert_array_equal(*(flags[way, i] for way in ways))
        medians = {}
        for way, values in times.items():
            q = statistics.quantiles(values, n=10)
            medians[way] = statistics.median(values)
            print(f"{kind:7s} {way:12s} {medians[way]:7.1f} ms a sample [p10 {q[0]:.1f} - p90 {q[-1]:.1f}]")
        print(f"{kind:7s} upstream / within: {medians['upstream'] / medians['within 1.5 m']:.1f}x, flags equal")


if __name__ == "__main__":
    main()
