"""LIDAR_TOP sweeps ray-cast into the world: ground, buildings, trees and agent boxes.

A 32-beam spinning LiDAR (HDL-32E-like elevations, nuScenes mounting at about -90 deg yaw) casts
rays from its position at the sweep timestamp; hits within 70 m become points (x, y, z, intensity,
ring) in the sensor frame, float32 N x 5, as in ``*.pcd.bin``. Rays are tested only against the
objects whose azimuth span covers them, so a sweep costs a few milliseconds.
"""

from __future__ import annotations

import numpy as np

from drivebench.data.nuscenes.maps import (
    GROUND_BUILDING,
    GROUND_CARPARK,
    GROUND_CROSSING,
    GROUND_MARKING,
    GROUND_ROAD,
    GROUND_SIDEWALK,
    GroundRaster,
)

N_BEAMS = 32
ELEVATIONS = np.deg2rad(np.linspace(10.67, -30.67, N_BEAMS))
MAX_RANGE = 70.0
MIN_RANGE = 1.0
GROUND_INTENSITY = {GROUND_ROAD: 8.0, GROUND_CROSSING: 60.0, GROUND_MARKING: 55.0, GROUND_SIDEWALK: 18.0,
                    GROUND_CARPARK: 10.0, GROUND_BUILDING: 25.0}


def ray_directions(n_azimuth: int) -> tuple[np.ndarray, np.ndarray]:
    """Unit directions (n_azimuth * 32, 3) in the sensor frame, azimuth-major; and the ring of each."""
    az = np.linspace(-np.pi, np.pi, n_azimuth, endpoint=False)
    el = ELEVATIONS
    ca, sa = np.cos(az)[:, None], np.sin(az)[:, None]
    ce, se = np.cos(el)[None, :], np.sin(el)[None, :]
    d = np.stack([ca * ce, sa * ce, np.broadcast_to(se, ca.shape[:1] + se.shape[1:])], axis=-1)
    ring = np.broadcast_to(np.arange(N_BEAMS), (n_azimuth, N_BEAMS))
    return d.reshape(-1, 3), ring.reshape(-1)


def cast(
    sensor2global: np.ndarray,
    n_azimuth: int,
    boxes: np.ndarray,
    box_ids: np.ndarray,
    ground: GroundRaster,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray]:
    """One sweep. ``boxes`` (B, 7) x, y, z_centre, w, l, h, yaw in the map frame with ids (B,) (-1 for
    static scenery). Returns points (N, 5) float32 in the sensor frame and the id each point hit
    (-2 ground)."""
    dirs_s, ring = ray_directions(n_azimuth)
    R = sensor2global[:3, :3]
    origin = sensor2global[:3, 3]
    dirs = dirs_s @ R.T
    dx_all, dy_all, dz_all = (np.ascontiguousarray(dirs[:, k]) for k in range(3))
    n_rays = len(dirs)
    t_best = np.full(n_rays, np.inf)
    hit = np.full(n_rays, -3, dtype=np.int64)
    # ground plane z = 0
    down = dirs[:, 2] < -1e-6
    t_g = np.where(down, -origin[2] / np.where(down, dirs[:, 2], -1.0), np.inf)
    t_best = np.where(t_g < t_best, t_g, t_best)
    hit[np.isfinite(t_g)] = -2
    # boxes: gather (ray, box) pairs inside each box's azimuth span, slab-test them all at once
    yaw_sensor = np.arctan2(R[1, 0], R[0, 0])
    rel = boxes[:, :2] - origin[:2]
    near = np.flatnonzero(np.linalg.norm(rel, axis=1) < MAX_RANGE + 0.5 * np.hypot(boxes[:, 3], boxes[:, 4]))
    if len(near):
        bx = boxes[near]
        c, s = np.cos(bx[:, 6]), np.sin(bx[:, 6])
        hl, hw, hh = bx[:, 4] / 2, bx[:, 3] / 2, bx[:, 5] / 2
        sx = np.array([-1, -1, 1, 1])[None, :]
        sy = np.array([-1, 1, -1, 1])[None, :]
        cx = bx[:, :1] + c[:, None] * hl[:, None] * sx - s[:, None] * hw[:, None] * sy - origin[0]
        cy = bx[:, 1:2] + s[:, None] * hl[:, None] * sx + c[:, None] * hw[:, None] * sy - origin[1]
        ang = np.arctan2(cy, cx)
        d = np.angle(np.exp(1j * (ang - ang[:, :1])))
        a0 = ang[:, 0] + d.min(axis=1) - yaw_sensor
        a1 = ang[:, 0] + d.max(axis=1) - yaw_sensor
        k0 = np.floor((a0 + np.pi) / (2 * np.pi) * n_azimuth).astype(np.int64) - 1
        k1 = np.ceil((a1 + np.pi) / (2 * np.pi) * n_azimuth).astype(np.int64) + 1
        inside = (a1 - a0) > np.pi  # the sensor is inside the footprint: every column
        k0 = np.where(inside, 0, k0)
        k1 = np.where(inside, n_azimuth - 1, k1)
        n_cols = k1 - k0 + 1
        box_of_col = np.repeat(np.arange(len(near)), n_cols)
        col = (np.arange(n_cols.sum()) - np.repeat(np.cumsum(n_cols) - n_cols, n_cols) + np.repeat(k0, n_cols))
        col %= n_azimuth
        pb = np.repeat(box_of_col, N_BEAMS)
        ray = (col[:, None] * N_BEAMS + np.arange(N_BEAMS)[None, :]).reshape(-1)
        ox, oy, oz = origin[0] - bx[pb, 0], origin[1] - bx[pb, 1], origin[2] - bx[pb, 2]
        cb, sb = c[pb], s[pb]
        dx, dy, dz = dx_all[ray], dy_all[ray], dz_all[ray]
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            tmin = np.full(len(ray), -np.inf)
            tmax = np.full(len(ray), np.inf)
            for o_, d_, h_ in ((cb * ox + sb * oy, cb * dx + sb * dy, hl[pb]),
                               (-sb * ox + cb * oy, -sb * dx + cb * dy, hw[pb]),
                               (oz, dz, hh[pb])):
                inv = 1.0 / d_
                ta = (-h_ - o_) * inv
                tb = (h_ - o_) * inv
                np.maximum(tmin, np.minimum(ta, tb), out=tmin)
                np.minimum(tmax, np.maximum(ta, tb), out=tmax)
        ok = (tmax >= tmin) & (tmin > 0) & (tmin < t_best[ray])
        ray, tmin, pb = ray[ok], tmin[ok], pb[ok]
        order = np.lexsort((tmin, ray))
        ray, tmin, pb = ray[order], tmin[order], pb[order]
        first = np.concatenate([[True], ray[1:] != ray[:-1]]) if len(ray) else np.zeros(0, bool)
        t_best[ray[first]] = tmin[first]
        hit[ray[first]] = box_ids[near[pb[first]]]
    valid = np.isfinite(t_best) & (t_best > MIN_RANGE) & (t_best < MAX_RANGE)
    t = t_best[valid]
    pts_g = origin + dirs[valid] * t[:, None]
    ids = hit[valid]
    intensity = np.where(ids >= 0, 40.0, 22.0)
    g = ids == -2
    if g.any():
        cls, _ = ground.lookup(pts_g[g, :2])
        lut = np.full(16, 12.0)
        for k, v in GROUND_INTENSITY.items():
            lut[k] = v
        intensity[g] = lut[cls]
    intensity = np.clip(intensity + rng.normal(0, 3.0, len(t)), 0, 255)
    # range noise; hits on boxes land just inside them, so nuScenes' points_in_box counts them
    rng_noise = np.where(ids >= 0, np.abs(rng.normal(0.0, 0.015, len(t))) + 0.002, rng.normal(0.0, 0.015, len(t)))
    pts_s = dirs_s[valid] * (t + rng_noise)[:, None]
    out = np.empty((len(t), 5), np.float32)
    out[:, :3] = pts_s
    out[:, 3] = np.round(intensity)
    out[:, 4] = ring[valid]
    return out, ids
