"""SurroundOcc-style semantic occupancy of a key frame, derived from the same world.

Grid: 200 x 200 x 16 voxels of 0.5 m over x, y in [-50, 50) m and z in [-5, 3) m of the LIDAR_TOP
frame. Stored as upstream SurroundOcc does: a sparse (K, 4) array of [x_idx, y_idx, z_idx, label]
per key frame (uint8 here; every value fits), only non-empty voxels; 17 (empty) is implicit.
The ground layer carries the surface class, building footprints their facades (a one-voxel
shell, as a surface reconstruction gives), trees their crowns, agents their boxes.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from drivebench.data.nuscenes.maps import (
    GROUND_BUILDING,
    GROUND_CARPARK,
    GROUND_CROSSING,
    GROUND_MARKING,
    GROUND_ROAD,
    GROUND_SIDEWALK,
    GROUND_TERRAIN,
    GroundRaster,
)

GRID = (200, 200, 16)
VOXEL = 0.5
LOWER = np.array([-50.0, -50.0, -5.0])
EMPTY = 17
# nuScenes category -> SurroundOcc class
OCC_CLASS = {
    "movable_object.barrier": 1, "vehicle.bicycle": 2, "vehicle.bus.rigid": 3, "vehicle.bus.bendy": 3,
    "vehicle.car": 4, "vehicle.construction": 5, "vehicle.motorcycle": 6, "human.pedestrian.adult": 7,
    "human.pedestrian.child": 7, "human.pedestrian.construction_worker": 7, "human.pedestrian.police_officer": 7,
    "movable_object.trafficcone": 8, "vehicle.trailer": 9, "vehicle.truck": 10,
}
GROUND_TO_OCC = {GROUND_ROAD: 11, GROUND_CROSSING: 11, GROUND_MARKING: 11, GROUND_CARPARK: 12,
                 GROUND_SIDEWALK: 13, GROUND_TERRAIN: 14, GROUND_BUILDING: 15}
VEGETATION, MANMADE = 16, 15


@lru_cache(maxsize=1)
def voxel_centres() -> np.ndarray:
    """(200, 200, 16, 3) voxel centres in the LiDAR frame (shared, read-only)."""
    axes = [LOWER[i] + VOXEL * (np.arange(GRID[i]) + 0.5) for i in range(3)]
    out = np.stack(np.meshgrid(*axes, indexing="ij"), axis=-1).astype(np.float32)
    out.flags.writeable = False
    return out


def occupancy_labels(
    lidar2global: np.ndarray,
    ground: GroundRaster,
    trees: np.ndarray,
    agent_boxes_global: np.ndarray,
    agent_categories: list[str],
) -> np.ndarray:
    """Sparse (K, 4) uint8 [x_idx, y_idx, z_idx, label] of one key frame."""
    labels = np.full(GRID, EMPTY, np.uint8)
    R, t = lidar2global[:3, :3], lidar2global[:3, 3]
    xs = LOWER[0] + VOXEL * (np.arange(GRID[0]) + 0.5)
    ys = LOWER[1] + VOXEL * (np.arange(GRID[1]) + 0.5)
    gx, gy = np.meshgrid(xs, ys, indexing="ij")
    # height of the ground (global z = 0) in each column of the LiDAR frame
    z_ground = -(R[2, 0] * gx + R[2, 1] * gy + t[2]) / R[2, 2]
    pts = np.stack([gx, gy, z_ground], -1) @ R.T + t
    cls, edge = ground.lookup(pts[..., :2])
    lut = np.full(256, EMPTY, np.uint8)
    for k, v in GROUND_TO_OCC.items():
        lut[k] = v
    zi = np.floor((z_ground - LOWER[2]) / VOXEL).astype(np.int64)
    ok = (zi >= 0) & (zi < GRID[2])
    ii, jj = np.nonzero(ok)
    labels[ii, jj, zi[ok]] = lut[cls[ok]]
    # facades: columns on a footprint border, from the ground up to the roof (or the grid top)
    top = np.floor((z_ground + edge - LOWER[2]) / VOXEL).astype(np.int64)
    z = np.arange(GRID[2])
    facade = ((edge > 0) & ok)[..., None] & (z >= zi[..., None]) & (z <= top[..., None])
    labels[facade] = MANMADE
    centres = None
    g2l = np.linalg.inv(lidar2global)
    # trees: trunk column and crown block
    if len(trees):
        tl = np.c_[trees[:, :2], np.zeros(len(trees))] @ g2l[:3, :3].T + g2l[:3, 3]
        near = (np.abs(tl[:, 0]) < 55) & (np.abs(tl[:, 1]) < 55)
        for (x, y, _), (_, _, r, top) in zip(tl[near], trees[near]):
            centres = voxel_centres() if centres is None else centres
            zg = z_ground_at(R, t, x, y)
            _fill_box(labels, centres, np.array([x, y, zg + 1.3, 0.3, 0.3, 2.6, 0.0]), VEGETATION)
            _fill_box(labels, centres, np.array([x, y, zg + 2.6 + (top - 2.6) / 2, 2 * r, 2 * r, top - 2.6, 0.6]),
                      VEGETATION)
    # agents (boxes in the map frame -> LiDAR frame)
    if len(agent_boxes_global):
        yaw_l2g = np.arctan2(R[1, 0], R[0, 0])
        for box, cat in zip(agent_boxes_global, agent_categories):
            label = OCC_CLASS.get(cat)
            if label is None:
                continue
            c = g2l[:3, :3] @ box[:3] + g2l[:3, 3]
            if np.abs(c[:2]).max() > 52:
                continue
            centres = voxel_centres() if centres is None else centres
            local = np.array([c[0], c[1], c[2], box[3], box[4], box[5], box[6] - yaw_l2g])
            _fill_box(labels, centres, local, label, at_least_centre=True)
    i, j, k = np.nonzero(labels != EMPTY)
    return np.stack([i, j, k, labels[i, j, k]], axis=1).astype(np.uint8)


def z_ground_at(R: np.ndarray, t: np.ndarray, x: float, y: float) -> float:
    return float(-(R[2, 0] * x + R[2, 1] * y + t[2]) / R[2, 2])


def _fill_box(labels: np.ndarray, centres: np.ndarray, box: np.ndarray, label: int, at_least_centre: bool = False):
    """Label the voxels whose centres lie in the box (x, y, z, w, l, h, yaw; LiDAR frame)."""
    x, y, z, w, l, h, yaw = box
    r = 0.5 * np.hypot(w, l) + VOXEL
    lo = np.floor((np.array([x - r, y - r, z - h / 2]) - LOWER) / VOXEL).astype(int)
    hi = np.ceil((np.array([x + r, y + r, z + h / 2]) - LOWER) / VOXEL).astype(int)
    lo = np.clip(lo, 0, GRID)
    hi = np.clip(hi, 0, GRID)
    if (hi <= lo).any():
        return
    sub = centres[lo[0]:hi[0], lo[1]:hi[1], lo[2]:hi[2]]
    d = sub - np.array([x, y, z])
    c, s = np.cos(yaw), np.sin(yaw)
    along = d[..., 0] * c + d[..., 1] * s
    across = -d[..., 0] * s + d[..., 1] * c
    inside = (np.abs(along) <= l / 2) & (np.abs(across) <= w / 2) & (np.abs(d[..., 2]) <= h / 2)
    view = labels[lo[0]:hi[0], lo[1]:hi[1], lo[2]:hi[2]]
    view[inside] = label
    if at_least_centre and not inside.any():
        ci = np.floor((np.array([x, y, z]) - LOWER) / VOXEL).astype(int)
        if ((ci >= 0) & (ci < GRID)).all():
            labels[ci[0], ci[1], ci[2]] = label


def densify(sparse: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sparse (K, 4) -> dense int64 labels (200, 200, 16) with 17 = empty, and the valid mask.

    The mask follows upstream GaussianFormer: voxels labelled 0 (others / noise) are not valid.
    """
    dense = np.full(GRID, EMPTY, np.int64)
    sparse = np.asarray(sparse)
    if len(sparse):
        dense[sparse[:, 0], sparse[:, 1], sparse[:, 2]] = sparse[:, 3]
    return dense, dense != 0
