"""drivebench.polylines: the one arc-length resampler (map GT, map metrics, synthetic maps)."""

from __future__ import annotations

import numpy as np
from shapely.geometry import LineString

from drivebench.polylines import resample, resample_many


def _shapely_reference(points: np.ndarray, num: int) -> np.ndarray:
    line = LineString(points)
    return np.array([line.interpolate(d).coords[0] for d in np.linspace(0.0, line.length, num)])


def test_resample_matches_shapely_interpolate_and_keeps_the_endpoints():
    rng = np.random.default_rng(3)
    for num in (2, 7, 100):
        points = np.cumsum(rng.normal(size=(9, 2)), axis=0)
        out = resample(points, num)
        np.testing.assert_allclose(out, _shapely_reference(points, num), atol=1e-9)
        assert np.array_equal(out[0], points[0]) and np.array_equal(out[-1], points[-1])
        assert out.dtype == np.float64


def test_resample_of_a_float32_polyline_measures_in_float64():
    points = np.array([[0.0, 0.0], [1.0, 0.0], [1.0, 3.0]], dtype=np.float32)
    np.testing.assert_array_equal(resample(points, 5), [[0, 0], [1, 0], [1, 1], [1, 2], [1, 3]])


def test_a_polyline_of_zero_length_gives_its_point():
    out = resample(np.array([[2.0, -1.0], [2.0, -1.0]]), 4)
    np.testing.assert_array_equal(out, np.tile([[2.0, -1.0]], (4, 1)))


def test_resample_many_agrees_with_resample_per_polyline():
    rng = np.random.default_rng(4)
    lines = [np.cumsum(rng.normal(size=(int(n), 2)), axis=0) for n in (2, 5, 13)]
    counts = np.array([3, 8, 21])
    for out, line, count in zip(resample_many(lines, counts), lines, counts):
        np.testing.assert_allclose(out, resample(line, int(count)), atol=1e-9)
