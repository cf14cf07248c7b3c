"""BEV grid, pillar reference points, camera projection and point normalisation for MapTR.

Conventions (upstream BEVFormer/MapTR): the BEV grid has ``bev_h`` rows along the lidar y axis and
``bev_w`` columns along the lidar x axis, flattened row-major (``index = row * bev_w + col``).
Normalised BEV coordinates are ``(x, y)`` in [0, 1] over ``pc_range``; map points are predicted in
these normalised coordinates and denormalised to metres.
"""

from __future__ import annotations

from typing import Sequence

import torch

PcRange = Sequence[float]  # (x_min, y_min, z_min, x_max, y_max, z_max), metres, lidar frame

# Constants enter as Python scalars, never as small tensors built from lists: on CUDA such a
# host-to-device copy blocks the host until the stream is idle.


def scale_xy(points: torch.Tensor, scale: tuple[float, float], offset: tuple[float, float] = (0.0, 0.0)
             ) -> torch.Tensor:
    """(x * sx + ox, y * sy + oy) on the last dimension."""
    return torch.stack([points[..., 0] * scale[0] + offset[0], points[..., 1] * scale[1] + offset[1]], dim=-1)


def normalize_points(points: torch.Tensor, pc_range: PcRange) -> torch.Tensor:
    """Metres -> [0, 1] over the x/y extent of ``pc_range`` (last dim is (x, y))."""
    sx, sy = pc_range[3] - pc_range[0], pc_range[4] - pc_range[1]
    return scale_xy(points, (1.0 / sx, 1.0 / sy), (-pc_range[0] / sx, -pc_range[1] / sy))


def denormalize_points(points: torch.Tensor, pc_range: PcRange) -> torch.Tensor:
    """[0, 1] -> metres (inverse of ``normalize_points``)."""
    return scale_xy(points, (pc_range[3] - pc_range[0], pc_range[4] - pc_range[1]), (pc_range[0], pc_range[1]))


def inverse_sigmoid(x: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """logit(x), clamped so that 0 and 1 stay finite (as mmdet's ``inverse_sigmoid``)."""
    x = x.clamp(0, 1)
    return torch.log(x.clamp(min=eps) / (1 - x).clamp(min=eps))


def bev_reference_points_2d(
    bev_h: int, bev_w: int, device: torch.device | None = None, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Normalised (x, y) centres of the BEV cells, (bev_h * bev_w, 2), row-major."""
    ys = (torch.arange(bev_h, device=device, dtype=dtype) + 0.5) / bev_h
    xs = (torch.arange(bev_w, device=device, dtype=dtype) + 0.5) / bev_w
    grid_y, grid_x = torch.meshgrid(ys, xs, indexing="ij")
    return torch.stack([grid_x.reshape(-1), grid_y.reshape(-1)], dim=-1)


def pillar_reference_points_3d(
    bev_h: int,
    bev_w: int,
    pc_range: PcRange,
    num_points_in_pillar: int,
    device: torch.device | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Metric 3D anchors of every BEV cell: (bev_h * bev_w, Z, 3).

    The Z anchors are spread over the pillar [z_min, z_max] as upstream does: fractions
    ``linspace(0.5, h - 0.5, Z) / h`` of the pillar height h in metres (for MapTR's 4 m pillar and
    Z = 4: -1.5, -0.5, 0.5, 1.5 m).
    """
    xy_m = denormalize_points(bev_reference_points_2d(bev_h, bev_w, device, dtype), pc_range)  # (HW, 2)
    height = pc_range[5] - pc_range[2]
    fractions = torch.linspace(0.5, height - 0.5, num_points_in_pillar, device=device, dtype=dtype) / height
    zs = pc_range[2] + height * fractions
    hw = xy_m.shape[0]
    return torch.cat(
        [xy_m[:, None, :].expand(hw, num_points_in_pillar, 2), zs[None, :, None].expand(hw, num_points_in_pillar, 1)],
        dim=-1,
    )


def project_to_cameras(
    points: torch.Tensor, lidar2img: torch.Tensor, image_hw: tuple[int, int], eps: float = 1e-5
) -> tuple[torch.Tensor, torch.Tensor]:
    """Project lidar-frame points into every camera.

    Args:
        points: (Q, Z, 3) metric points (shared by the batch).
        lidar2img: (B, N, 4, 4) lidar -> (augmented, padded) image pixels.
        image_hw: (H, W) of the padded image tensor: the feature map covers it, so coordinates are
            normalised by it (upstream divides by ``img_shape`` after padding).

    Returns:
        uv: (B, N, Q, Z, 2) normalised (x, y) image coordinates, [0, 1] inside the image.
        visible: bool (B, N, Q, Z): in front of the camera and strictly inside the image.
    """
    # Projection in fp32 even under autocast: depths of a few cm divide the coordinates.
    with torch.autocast(device_type=points.device.type, enabled=False):
        homo = torch.cat([points.float(), points.new_ones(points.shape[:-1] + (1,)).float()], dim=-1)
        cam = torch.einsum("bnij,qzj->bnqzi", lidar2img.float(), homo)
        depth = cam[..., 2:3]
        uv = cam[..., 0:2] / depth.clamp(min=eps)
        uv = scale_xy(uv, (1.0 / image_hw[1], 1.0 / image_hw[0]))
        visible = (depth[..., 0] > eps) & (uv > 0.0).all(-1) & (uv < 1.0).all(-1)
    return uv, visible
