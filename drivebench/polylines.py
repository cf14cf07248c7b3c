"""Polylines resampled to points evenly spaced by arc length (shapely's ``interpolate`` in bulk).

Why one module: map ground truth (MapTR / SparseDrive transforms), the map metrics, the synthetic
MapTR elements and the synthetic Argoverse 2 lanes all resample polylines; they share these two
functions so that a change to the arithmetic is made once. Points are (P, 2) arrays; the results
are float64.
"""

from __future__ import annotations

import numpy as np


def resample(points: np.ndarray, num: int) -> np.ndarray:
    """``num`` points evenly spaced by arc length from the first point of ``points`` (P, 2) to its last.

    Upstream MapTR's ``line.interpolate(d)`` at ``d = np.linspace(0, line.length, num)``, as one
    ``np.interp``. The distances are ``length * (i / (num - 1))``: the same as ``np.linspace`` up to the
    last bit, and bit for bit what the synthetic Argoverse 2 generator has always used, so its
    files do not change. A polyline of zero length gives its first point ``num`` times.
    """
    points = np.asarray(points, dtype=np.float64)
    seg = np.linalg.norm(np.diff(points, axis=0), axis=1)
    cum = np.concatenate([[0.0], np.cumsum(seg)])
    if cum[-1] <= 0:
        return np.repeat(points[:1], num, axis=0)
    at = cum[-1] * (np.arange(num) / max(num - 1, 1))
    return np.stack([np.interp(at, cum, points[:, 0]), np.interp(at, cum, points[:, 1])], axis=-1)


def resample_many(polylines: list[np.ndarray], counts: np.ndarray) -> list[np.ndarray]:
    """``counts[i]`` (>= 2) evenly spaced points along each polyline, vectorised over all of them.

    Why a second form: the synthetic Argoverse 2 writer resamples every lane and lane boundary of a
    scene at once. Its arithmetic (a search, then a linear blend) is not :func:`resample`'s
    ``np.interp``, so the two can differ in the last bit; each caller keeps the one it was written with.
    """
    sizes = np.array([len(p) for p in polylines])
    counts = np.asarray(counts, dtype=np.int64)
    points = np.concatenate(polylines)
    starts = np.cumsum(sizes) - sizes
    seg = np.hypot(*np.diff(points, axis=0).T)
    seg[starts[1:] - 1] = 0.0  # no length between one polyline's end and the next one's start
    cum = np.concatenate([[0.0], np.cumsum(seg)])
    first, last = cum[starts], cum[starts + sizes - 1]
    owner = np.repeat(np.arange(len(polylines)), counts)
    target_starts = np.cumsum(counts) - counts
    fraction = (np.arange(int(counts.sum())) - target_starts[owner]) / (counts[owner] - 1)
    target = first[owner] + fraction * (last - first)[owner]
    index = np.searchsorted(cum, target, side="right") - 1
    index = np.clip(index, starts[owner], starts[owner] + sizes[owner] - 2)
    span = cum[index + 1] - cum[index]
    t = np.where(span > 0, (target - cum[index]) / np.where(span > 0, span, 1.0), 0.0)
    out = points[index] + t[:, None] * (points[index + 1] - points[index])
    return np.split(out, np.cumsum(counts)[:-1])


__all__ = ["resample", "resample_many"]
