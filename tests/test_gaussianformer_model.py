"""GaussianFormer end to end on CPU at the ``test`` size: contract, gradients, training, Lightning module."""

from __future__ import annotations

import math
import time

import pytest
import torch

from drivebench.models import create_model, get_spec

NUSCENES_CAM_YAWS_DEG = (0.0, -55.0, 55.0, 180.0, 110.0, -110.0)  # FRONT, FRONT_RIGHT, FRONT_LEFT, BACK, BACK_LEFT, BACK_RIGHT


def _camera_matrices(h: int, w: int, yaw_deg: float, height: float = 1.6) -> tuple[torch.Tensor, torch.Tensor]:
    """(cam2lidar 4x4, intrinsic 3x3) of a pinhole camera at ``height`` looking along ``yaw`` (70 deg fov)."""
    yaw = math.radians(yaw_deg)
    forward = torch.tensor([math.cos(yaw), math.sin(yaw), 0.0])
    right = torch.tensor([math.sin(yaw), -math.cos(yaw), 0.0])
    down = torch.tensor([0.0, 0.0, -1.0])
    cam2lidar = torch.eye(4)
    cam2lidar[:3, :3] = torch.stack([right, down, forward], dim=1)  # columns: camera x, y, z in lidar frame
    cam2lidar[:3, 3] = torch.tensor([0.0, 0.0, height])
    f = 0.5 * w / math.tan(math.radians(35.0))
    intrinsic = torch.tensor([[f, 0.0, 0.5 * w], [0.0, f, 0.5 * h], [0.0, 0.0, 1.0]])
    return cam2lidar, intrinsic


def synthetic_occupancy(grid_shape: tuple[int, int, int], generator: torch.Generator) -> torch.Tensor:
    """Empty (17) everywhere, a drivable ground plane (11) on the lowest layer and a few class boxes on it."""
    x, y, z = grid_shape
    label = torch.full(grid_shape, 17, dtype=torch.long)
    label[:, :, 0] = 11
    for cls in (4, 15, 7, 16):  # car, manmade, pedestrian, vegetation
        sx, sy = (int(v) for v in torch.randint(2, max(3, x // 4), (2,), generator=generator))
        x0 = int(torch.randint(0, x - sx, (1,), generator=generator))
        y0 = int(torch.randint(0, y - sy, (1,), generator=generator))
        top = int(torch.randint(2, z + 1, (1,), generator=generator))
        label[x0:x0 + sx, y0:y0 + sy, 1:top] = cls
    return label


def make_batch(batch_size: int = 2, image_hw: tuple[int, int] = (64, 96), grid_shape=(20, 20, 4),
               seed: int = 0, num_cams: int = 6) -> dict:
    """A random batch with every camera-model key of ``docs/batch-contract.md`` plus occupancy labels."""
    gen = torch.Generator().manual_seed(seed)
    h, w = image_hw
    cams = [_camera_matrices(h, w, yaw) for yaw in NUSCENES_CAM_YAWS_DEG[:num_cams]]
    cam2lidar = torch.stack([c for c, _ in cams])
    intrinsic = torch.stack([k for _, k in cams])
    viewpad = torch.eye(4).repeat(num_cams, 1, 1)
    viewpad[:, :3, :3] = intrinsic
    lidar2img = viewpad @ torch.linalg.inv(cam2lidar)
    rep = lambda t: t.unsqueeze(0).repeat(batch_size, *([1] * t.dim()))  # noqa: E731
    labels = torch.stack([synthetic_occupancy(tuple(grid_shape), gen) for _ in range(batch_size)])
    return {
        "img": torch.randn(batch_size, num_cams, 3, h, w, generator=gen),
        "img_shape": torch.tensor([h, w]).repeat(batch_size, num_cams, 1),
        "lidar2img": rep(lidar2img),
        "cam_intrinsic": rep(intrinsic),
        "cam2lidar": rep(cam2lidar),
        "lidar2ego": torch.eye(4).repeat(batch_size, 1, 1),
        "ego2global": torch.eye(4).repeat(batch_size, 1, 1),
        "can_bus": torch.zeros(batch_size, 18),
        "timestamp": torch.arange(batch_size, dtype=torch.float64),
        "sequence_id": torch.zeros(batch_size, dtype=torch.long),
        "frame_idx": torch.arange(batch_size),
        "prev_exists": torch.zeros(batch_size, dtype=torch.bool),
        "occ_label": labels,
        "occ_mask": torch.ones_like(labels, dtype=torch.bool),
    }
