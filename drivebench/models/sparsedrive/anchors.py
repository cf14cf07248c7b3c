"""Initial anchors of SparseDrive's heads.

Upstream loads k-means clusters of the nuScenes training set (``tools/kmeans/*.py``): detection
centres, map-element centres, per-class agent futures and per-command ego futures. Here the
network is built with the deterministic, data-free defaults below (same shapes, plausible geometry
in the lidar frame, whose forward direction is ``forward_yaw`` (pi/2 in nuScenes' LIDAR_TOP: x
right, y forward), metres), or with ``.npy`` files of upstream's layout; the LightningModule then
replaces the defaults with k-means clusters of the training infos (``kmeans.py``) once the data is
prepared (``model.module.anchors=kmeans``, the default).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch


def load_or_default(path: str | None, default: torch.Tensor, what: str) -> torch.Tensor:
    """The anchors in ``path`` (a ``.npy`` of the default's shape) or ``default``."""
    if path is None:
        return default
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"{what} anchor file {file} does not exist; pass null to use the built-in default anchors")
    arr = torch.from_numpy(np.load(file)).float()
    if arr.dim() == default.dim() + 1 and what == "map":  # upstream stores (K, 20, 2)
        arr = arr.flatten(1)
    if arr.shape[1:] != default.shape[1:]:
        raise ValueError(f"{what} anchors in {file} have shape {tuple(arr.shape)}; expected (*, {', '.join(map(str, default.shape[1:]))})")
    return arr[: default.shape[0]]


def default_detection_anchors(num: int, radius: float = 55.0, seed: int = 0) -> torch.Tensor:
    """(num, 11) anchor states: centres spread uniformly over a disc of ``radius`` m (seeded), z in
    [-2, 0.5], log sizes 1 and yaw 90 deg with zero velocity, the non-centre values upstream uses."""
    g = torch.Generator().manual_seed(seed)
    r = radius * torch.rand(num, generator=g).sqrt()
    theta = 2 * math.pi * torch.rand(num, generator=g)
    z = -2.0 + 2.5 * torch.rand(num, generator=g)
    anchors = torch.zeros(num, 11)
    anchors[:, 0], anchors[:, 1], anchors[:, 2] = r * torch.cos(theta), r * torch.sin(theta), z
    anchors[:, 3:6] = 1.0
    anchors[:, 6] = 1.0  # sin(yaw)
    return anchors


def default_map_anchors(num: int, num_sample: int = 20, roi: tuple[float, float] = (30.0, 60.0),
                        length: float = 8.0, forward_yaw: float = math.pi / 2) -> torch.Tensor:
    """(num, 2 * num_sample): straight ``length`` m segments along the driving direction, centres on
    a grid over the roi (x extent, y extent) — upstream uses k-means centres with an 8 m segment each."""
    cols = max(int(round(math.sqrt(num * roi[1] / roi[0]))), 1)
    rows = math.ceil(num / cols)
    xs = (torch.arange(rows) + 0.5) / rows * roi[0] - roi[0] / 2
    ys = (torch.arange(cols) + 0.5) / cols * roi[1] - roi[1] / 2
    centres = torch.stack(torch.meshgrid(xs, ys, indexing="ij"), dim=-1).reshape(-1, 2)[:num]
    along = torch.linspace(-length / 2, length / 2, num_sample)
    offsets = torch.stack([along * math.cos(forward_yaw), along * math.sin(forward_yaw)], dim=-1)
    return (centres[:, None] + offsets[None]).reshape(num, 2 * num_sample)


def _arc(speed: float, curvature: float, steps: int, dt: float) -> torch.Tensor:
    """(steps, 2) positions along a constant-curvature path from the origin heading +x."""
    s = speed * dt * torch.arange(1, steps + 1, dtype=torch.float64)
    if abs(curvature) < 1e-6:
        return torch.stack([s, torch.zeros_like(s)], dim=-1).float()
    return torch.stack([torch.sin(curvature * s) / curvature, (1 - torch.cos(curvature * s)) / curvature], dim=-1).float()


# typical speeds (m/s) of the ten detection classes, for the default agent futures
_CLASS_SPEED = (8.0, 7.0, 2.0, 7.0, 6.0, 0.0, 6.0, 4.0, 1.4, 0.0)


def default_motion_anchors(num_cls: int = 10, modes: int = 6, steps: int = 12, dt: float = 0.5) -> torch.Tensor:
    """(num_cls, modes, steps, 2) cumulative agent-frame futures (x along the heading): stopped,
    slow/medium/fast straight, and a left and a right turn at the class's typical speed."""
    out = torch.zeros(num_cls, modes, steps, 2)
    for c in range(num_cls):
        v = _CLASS_SPEED[c] if c < len(_CLASS_SPEED) else 5.0
        specs = [(0.0, 0.0), (0.5 * v, 0.0), (v, 0.0), (1.5 * v, 0.0), (v, 0.05), (v, -0.05)]
        for m in range(modes):
            speed, kappa = specs[m % len(specs)]
            out[c, m] = _arc(speed, kappa, steps, dt)
    return out


def default_plan_anchors(modes: int = 6, steps: int = 6, dt: float = 0.5, forward_yaw: float = math.pi / 2) -> torch.Tensor:
    """(3, modes, steps, 2) cumulative ego futures per command (turn right, turn left, go straight)
    in the lidar frame, at speeds spread over 1-11 m/s; turns follow a 0.08 1/m curvature (about a
    12 m radius)."""
    speeds = torch.linspace(1.0, 11.0, modes).tolist()
    out = torch.zeros(3, modes, steps, 2)
    for cmd, kappa in enumerate((-0.08, 0.08, 0.0)):
        for m, v in enumerate(speeds):
            out[cmd, m] = _arc(v, kappa, steps, dt)
    cos, sin = math.cos(forward_yaw), math.sin(forward_yaw)
    return torch.stack([out[..., 0] * cos - out[..., 1] * sin, out[..., 0] * sin + out[..., 1] * cos], dim=-1)
