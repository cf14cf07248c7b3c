"""Random MapTR batches that follow ``docs/batch-contract.md``: for tests, benchmarks and
``--synthetic`` runs that need no dataset.

The camera rig imitates nuScenes (six cameras around the car, ~65 deg horizontal field of view,
mounted 1.5 m high); the map ground truth is a few straight dividers, rectangular pedestrian
crossings and curved boundaries inside the BEV range, resampled to 20 points with their
equivalent orderings (polylines: forward and reverse; polygons: the cyclic shifts of the closed
ring), padded to ``num_orderings`` with -10000 as upstream.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
import torch

from drivebench.polylines import resample

# (yaw in degrees in the lidar frame, x forward / y left) in the contract's camera order
NUSCENES_CAMERA_YAWS = {
    "CAM_FRONT": 0.0, "CAM_FRONT_RIGHT": -55.0, "CAM_FRONT_LEFT": 55.0,
    "CAM_BACK": 180.0, "CAM_BACK_LEFT": 110.0, "CAM_BACK_RIGHT": -110.0,
}
PAD_VALUE = -10000.0


def camera_rig(image_hw: tuple[int, int], valid_hw: tuple[int, int] | None = None,
               height: float = -0.3) -> dict[str, torch.Tensor]:
    """Intrinsics and extrinsics of a nuScenes-like rig for images of ``valid_hw`` (padded to ``image_hw``).

    Returns ``lidar2img`` (6, 4, 4), ``cam_intrinsic`` (6, 3, 3) and ``cam2lidar`` (6, 4, 4).
    """
    vh, vw = valid_hw or image_hw
    focal = 1266.0 * vw / 1600.0  # nuScenes front camera focal length at 1600 px width
    intrinsic = torch.tensor([[focal, 0.0, vw / 2.0], [0.0, focal, vh / 2.0], [0.0, 0.0, 1.0]])
    lidar2img, cam2lidar = [], []
    for yaw_deg in NUSCENES_CAMERA_YAWS.values():
        yaw = math.radians(yaw_deg)
        forward = torch.tensor([math.cos(yaw), math.sin(yaw), 0.0])
        right = torch.tensor([math.sin(yaw), -math.cos(yaw), 0.0])
        down = torch.tensor([0.0, 0.0, -1.0])
        c2l = torch.eye(4)
        c2l[:3, :3] = torch.stack([right, down, forward], dim=1)  # camera axes (x right, y down, z fwd)
        c2l[:3, 3] = torch.tensor([0.0, 0.0, height])
        k4 = torch.eye(4)
        k4[:3, :3] = intrinsic
        lidar2img.append(k4 @ torch.linalg.inv(c2l))
        cam2lidar.append(c2l)
    return {
        "lidar2img": torch.stack(lidar2img),
        "cam_intrinsic": intrinsic.expand(6, 3, 3).clone(),
        "cam2lidar": torch.stack(cam2lidar),
    }


def polyline_orderings(points: np.ndarray, num_orderings: int) -> tuple[np.ndarray, int]:
    """Forward and reversed polyline, padded: ((num_orderings, P, 2), 2)."""
    out = np.full((num_orderings,) + points.shape, PAD_VALUE, dtype=np.float32)
    out[0], out[1] = points, points[::-1]
    return out, 2


def polygon_orderings(points: np.ndarray, num_orderings: int) -> tuple[np.ndarray, int]:
    """Cyclic shifts of a closed ring (``points[0] == points[-1]``): ((num_orderings, P, 2), P - 1)."""
    ring = points[:-1]
    shifts = min(len(ring), num_orderings)
    out = np.full((num_orderings,) + points.shape, PAD_VALUE, dtype=np.float32)
    for k in range(shifts):
        rolled = np.roll(ring, k, axis=0)
        out[k] = np.concatenate([rolled, rolled[:1]], axis=0)
    return out, shifts


def synthetic_map_elements(
    rng: np.random.Generator, pc_range: Sequence[float], counts: Sequence[int] = (2, 1, 2), num_pts: int = 20,
    num_orderings: int = 19,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A few map elements: (pts (n, S, P, 2), labels (n,), num_orderings (n,)) in metres."""
    x0, y0, _, x1, y1, _ = pc_range
    margin = 1.0
    elements, labels, valid = [], [], []

    def clip(p: np.ndarray) -> np.ndarray:
        return np.stack([p[:, 0].clip(x0, x1), p[:, 1].clip(y0, y1)], axis=-1)

    for _ in range(counts[0]):  # divider: a straight lane line along x-ish
        y = rng.uniform(y0 + margin, y1 - margin)
        start = np.array([rng.uniform(x0 + margin, 0.0), y])
        end = np.array([rng.uniform(2.0, x1 - margin), y + rng.uniform(-2.0, 2.0)])
        line = resample(np.stack([start, end]), num_pts)
        pts, n = polyline_orderings(clip(line), num_orderings)
        elements.append(pts), labels.append(0), valid.append(n)
    for _ in range(counts[1]):  # ped crossing: a rectangle, closed ring
        cx, cy = rng.uniform(x0 + 4, x1 - 4), rng.uniform(y0 + 4, y1 - 4)
        hw, hh = rng.uniform(1.5, 3.0), rng.uniform(2.0, 3.5)
        corners = np.array([[cx - hw, cy - hh], [cx + hw, cy - hh], [cx + hw, cy + hh], [cx - hw, cy + hh],
                            [cx - hw, cy - hh]])
        ring = resample(corners, num_pts)
        ring[-1] = ring[0]
        pts, n = polygon_orderings(clip(ring), num_orderings)
        elements.append(pts), labels.append(1), valid.append(n)
    for _ in range(counts[2]):  # boundary: a gently curved road edge along y
        x = rng.uniform(x0 + margin, x1 - margin)
        ys = np.linspace(rng.uniform(y0 + margin, -5.0), rng.uniform(5.0, y1 - margin), 50)
        bend = rng.uniform(-3.0, 3.0)
        xs = x + bend * np.sin(np.linspace(0.0, math.pi, 50))
        line = resample(np.stack([xs, ys], axis=-1), num_pts)
        pts, n = polyline_orderings(clip(line), num_orderings)
        elements.append(pts), labels.append(2), valid.append(n)
    return (torch.from_numpy(np.stack(elements)).float(), torch.tensor(labels, dtype=torch.long),
            torch.tensor(valid, dtype=torch.long))


def random_map_batch(
    batch_size: int = 2,
    image_hw: tuple[int, int] = (64, 96),
    valid_hw: tuple[int, int] | None = None,
    pc_range: Sequence[float] = (-15.0, -30.0, -2.0, 15.0, 30.0, 2.0),
    counts: Sequence[int] = (2, 1, 2),
    num_orderings: int = 19,
    seed: int = 0,
    device: torch.device | str = "cpu",
) -> dict[str, Any]:
    """A batch with every camera-model key MapTR reads plus the map ground truth."""
    gen = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    h, w = image_hw
    valid_hw = valid_hw or image_hw
    rig = camera_rig(image_hw, valid_hw)
    b = batch_size
    yaw = torch.rand(b, generator=gen) * 2 * math.pi
    quat = torch.stack([torch.cos(yaw / 2), torch.zeros(b), torch.zeros(b), torch.sin(yaw / 2)], dim=-1)
    can_bus = torch.cat([
        torch.rand(b, 3, generator=gen) * torch.tensor([2000.0, 2000.0, 0.0]),  # global translation
        quat,
        torch.randn(b, 3, generator=gen),  # acceleration
        torch.randn(b, 3, generator=gen) * 0.1,  # rotation rate
        torch.randn(b, 3, generator=gen) * 5.0,  # velocity
        yaw[:, None], torch.rad2deg(yaw)[:, None],
    ], dim=-1)
    gts = [synthetic_map_elements(rng, pc_range, counts, 20, num_orderings) for _ in range(b)]
    batch: dict[str, Any] = {
        "img": torch.randn(b, 6, 3, h, w, generator=gen),
        "img_shape": torch.tensor(valid_hw).expand(b, 6, 2).clone(),
        "lidar2img": rig["lidar2img"].expand(b, 6, 4, 4).clone(),
        "cam_intrinsic": rig["cam_intrinsic"].expand(b, 6, 3, 3).clone(),
        "cam2lidar": rig["cam2lidar"].expand(b, 6, 4, 4).clone(),
        "lidar2ego": torch.eye(4).expand(b, 4, 4).clone(),
        "ego2global": torch.eye(4).expand(b, 4, 4).clone(),
        "can_bus": can_bus,
        "timestamp": torch.arange(b, dtype=torch.float64) * 0.5,
        "sequence_id": torch.arange(b),
        "frame_idx": torch.zeros(b, dtype=torch.long),
        "prev_exists": torch.zeros(b, dtype=torch.bool),
        "gt_map_pts": [g[0] for g in gts],
        "gt_map_labels": [g[1] for g in gts],
        "gt_map_num_orderings": [g[2] for g in gts],
    }
    return _to(batch, torch.device(device))


def _to(obj: Any, device: torch.device) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, dict):
        return {k: _to(v, device) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_to(v, device) for v in obj]
    return obj
