"""Photometric distortion as MapTR / SparseDrive / GaussianFormer apply it, with explicit parameters.

Upstream draws its randomness from the global ``np.random`` inside the transform, so the same
sample gets a different augmentation in every worker. Here the parameters are drawn from
``results["rng"]`` (seeded by seed, epoch and index) into a (views, 13) array; the CPU path applies
them with cv2 exactly as mmcv does, and ``device.photometric`` applies the same array in torch.

Per view: 0 brightness on, 1 delta, 2 mode (1: contrast before the HSV step, 0: after),
3 contrast on, 4 alpha, 5 saturation on, 6 factor, 7 hue on, 8 delta (deg), 9 swap channels on,
10..12 channel permutation.
"""

from __future__ import annotations

import cv2
import numpy as np

N_PARAMS = 13


def sample_photometric_params(
    rng: np.random.Generator,
    n_views: int,
    brightness_delta: float = 32,
    contrast_range: tuple[float, float] = (0.5, 1.5),
    saturation_range: tuple[float, float] = (0.5, 1.5),
    hue_delta: float = 18,
) -> np.ndarray:
    """Every field is drawn for every view (fixed number of draws), then the on/off flags gate them."""
    p = np.zeros((n_views, N_PARAMS), np.float32)
    for v in range(n_views):
        p[v, 0] = rng.integers(2)
        p[v, 1] = rng.uniform(-brightness_delta, brightness_delta)
        p[v, 2] = rng.integers(2)
        p[v, 3] = rng.integers(2)
        p[v, 4] = rng.uniform(*contrast_range)
        p[v, 5] = rng.integers(2)
        p[v, 6] = rng.uniform(*saturation_range)
        p[v, 7] = rng.integers(2)
        p[v, 8] = rng.uniform(-hue_delta, hue_delta)
        p[v, 9] = rng.integers(2)
        p[v, 10:13] = rng.permutation(3)
    return p


def apply_photometric(img: np.ndarray, p: np.ndarray) -> np.ndarray:
    """One float32 BGR image (H, W, 3), modified as mmcv's PhotoMetricDistortion would (returns it)."""
    if img.dtype != np.float32:
        raise TypeError("photometric distortion needs float32 images: load with to_float32=True")
    if p[0]:
        img += np.float32(p[1])
    if p[2] == 1 and p[3]:
        img *= np.float32(p[4])
    img = cv2.cvtColor(img, cv2.COLOR_BGR2HSV)
    if p[5]:
        img[..., 1] *= np.float32(p[6])
    if p[7]:
        hue = img[..., 0]
        hue += np.float32(p[8])
        hue[hue > 360] -= 360
        hue[hue < 0] += 360
    img = cv2.cvtColor(img, cv2.COLOR_HSV2BGR)
    if p[2] == 0 and p[3]:
        img *= np.float32(p[4])
    if p[9]:
        img = np.ascontiguousarray(img[..., p[10:13].astype(np.int64)])
    return img


class PhotoMetricDistortionMultiView:
    """Draw per-view parameters from ``results["rng"]``; apply them now (CPU) or leave them in
    ``results["photometric_params"]`` for the device (``apply=False``)."""

    def __init__(
        self,
        brightness_delta: float = 32,
        contrast_range: tuple[float, float] = (0.5, 1.5),
        saturation_range: tuple[float, float] = (0.5, 1.5),
        hue_delta: float = 18,
        apply: bool = True,
    ) -> None:
        self.cfg = dict(brightness_delta=brightness_delta, contrast_range=tuple(contrast_range),
                        saturation_range=tuple(saturation_range), hue_delta=hue_delta)
        self.apply = apply

    def __call__(self, results: dict) -> dict:
        n = len(results["img"]) if "img" in results else len(results["img_jpeg"])
        params = sample_photometric_params(results["rng"], n, **self.cfg)
        results["photometric_params"] = params
        if self.apply:
            results["img"] = [apply_photometric(img, p) for img, p in zip(results["img"], params)]
        return results
