"""Box and trajectory geometry for SparseDrive: the anchor state layout and the frame algebra.

Conventions (``docs/batch-contract.md``): the LIDAR_TOP frame of the key frame, x forward, y left,
z up. A ground-truth box is ``x, y, z, w, l, h, yaw, vx, vy`` where ``l`` is the extent along the
heading, ``w`` the extent across it and ``yaw`` the heading angle from +x, counter-clockwise.

The network works on an 11-d *anchor state* (as Sparse4D): centre, log size, (sin, cos) of yaw and
a 3-d velocity. Keeping log sizes and sin/cos makes every component an unconstrained regression.
"""

from __future__ import annotations

import math

import torch

# indices into the 11-d anchor state
X, Y, Z, W, L, H, SIN_YAW, COS_YAW, VX, VY, VZ = range(11)
STATE_DIMS = 11
# the first 10 state dimensions have ground truth (no vz); losses and matching use these
REG_DIMS = 10
# indices into a decoded / ground-truth box (x, y, z, w, l, h, yaw, vx, vy)
YAW = 6
# quality head outputs
CNS, YNS = 0, 1


def encode_boxes(boxes: torch.Tensor) -> torch.Tensor:
    """(..., 9) ground-truth boxes -> (..., 10) regression targets (x, y, z, log w/l/h, sin, cos, vx, vy)."""
    return torch.cat(
        [
            boxes[..., 0:3],
            boxes[..., 3:6].clamp(min=1e-3).log(),
            torch.sin(boxes[..., YAW : YAW + 1]),
            torch.cos(boxes[..., YAW : YAW + 1]),
            boxes[..., 7:9],
        ],
        dim=-1,
    )


def decode_boxes(state: torch.Tensor) -> torch.Tensor:
    """(..., >=10) anchor states -> (..., 9) boxes (x, y, z, w, l, h, yaw, vx, vy)."""
    yaw = torch.atan2(state[..., SIN_YAW], state[..., COS_YAW])
    return torch.cat([state[..., 0:3], state[..., 3:6].exp(), yaw[..., None], state[..., VX : VY + 1]], dim=-1)


def rigid_inverse(transform: torch.Tensor) -> torch.Tensor:
    """Inverse of (..., 4, 4) rigid transforms without a general matrix inverse."""
    rot = transform[..., :3, :3]
    trans = transform[..., :3, 3:]
    rot_t = rot.transpose(-1, -2)
    top = torch.cat([rot_t, -rot_t @ trans], dim=-1)
    bottom = torch.zeros_like(transform[..., 3:, :])
    bottom[..., 3] = 1.0
    return torch.cat([top, bottom], dim=-2)


def lidar_to_global(lidar2ego: torch.Tensor, ego2global: torch.Tensor) -> torch.Tensor:
    """(B, 4, 4) lidar -> global, computed in float64 (global translations are ~1e3 m)."""
    return ego2global.double() @ lidar2ego.double()


def project_box_anchors(anchor: torch.Tensor, prev2cur: torch.Tensor, dt: torch.Tensor | None = None) -> torch.Tensor:
    """Move box anchor states of the previous frame into the current lidar frame.

    Args:
        anchor: (B, Q, 11) states in the previous frame.
        prev2cur: (B, 4, 4) previous lidar frame -> current lidar frame.
        dt: optional (B,) seconds from the previous to the current frame; each centre first moves
            by its own velocity over ``dt`` (as Sparse4D), then the ego motion is applied.
    """
    rot = prev2cur[:, None, :3, :3].to(anchor.dtype)
    trans = prev2cur[:, None, :3, 3].to(anchor.dtype)
    centre = anchor[..., X : Z + 1]
    vel = anchor[..., VX:]
    if dt is not None:
        centre = centre + vel * dt.to(anchor.dtype)[:, None, None]
    centre = (rot @ centre[..., None]).squeeze(-1) + trans
    cos_sin = (rot[..., :2, :2] @ torch.stack((anchor[..., COS_YAW], anchor[..., SIN_YAW]), dim=-1)[..., None]).squeeze(-1)
    vel_dims = vel.shape[-1]
    vel = (rot[..., :vel_dims, :vel_dims] @ vel[..., None]).squeeze(-1)
    return torch.cat([centre, anchor[..., W : H + 1], cos_sin[..., 1:2], cos_sin[..., 0:1], vel], dim=-1)


def project_points_2d(points: torch.Tensor, prev2cur: torch.Tensor) -> torch.Tensor:
    """(B, Q, P*2) flattened (x, y) polylines -> the same in the current frame (ground-plane motion)."""
    b, q, d = points.shape
    pts = points.view(b, q, d // 2, 2)
    rot = prev2cur[:, None, None, :2, :2].to(points.dtype)
    trans = prev2cur[:, None, None, :2, 3].to(points.dtype)
    return ((rot @ pts[..., None]).squeeze(-1) + trans).reshape(b, q, d)


def rotate_2d(xy: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (..., 2) vectors counter-clockwise by the angle with the given cos/sin (broadcast)."""
    return torch.stack([xy[..., 0] * cos - xy[..., 1] * sin, xy[..., 0] * sin + xy[..., 1] * cos], dim=-1)


def box_corners_2d(boxes: torch.Tensor) -> torch.Tensor:
    """(..., >=7) boxes -> (..., 4, 2) bird's-eye corners (counter-clockwise)."""
    half_l = boxes[..., 4] / 2
    half_w = boxes[..., 3] / 2
    sx = torch.tensor([1.0, -1.0, -1.0, 1.0], dtype=boxes.dtype, device=boxes.device)
    sy = torch.tensor([1.0, 1.0, -1.0, -1.0], dtype=boxes.dtype, device=boxes.device)
    local = torch.stack([half_l[..., None] * sx, half_w[..., None] * sy], dim=-1)
    yaw = boxes[..., YAW][..., None]
    return rotate_2d(local, torch.cos(yaw), torch.sin(yaw)) + boxes[..., None, 0:2]


def boxes_overlap_bev(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Whether bird's-eye rectangles overlap (separating-axis test; touching counts as overlap).

    The same answer as shapely's ``Polygon.intersects`` on the two rectangles, which is what
    SparseDrive's planning metric uses; here vectorised over broadcast leading dimensions.
    """
    ca, cb = box_corners_2d(a), box_corners_2d(b)
    ca, cb = torch.broadcast_tensors(ca, cb)
    axes = []
    for corners in (ca, cb):
        edge0 = corners[..., 1, :] - corners[..., 0, :]
        edge1 = corners[..., 3, :] - corners[..., 0, :]
        axes += [edge0, edge1]
    separated = torch.zeros(ca.shape[:-2], dtype=torch.bool, device=ca.device)
    eps = 1e-9
    for axis in axes:
        pa = (ca * axis[..., None, :]).sum(-1)
        pb = (cb * axis[..., None, :]).sum(-1)
        gap = (pa.amin(-1) > pb.amax(-1) + eps) | (pb.amin(-1) > pa.amax(-1) + eps)
        separated = separated | gap
    return ~separated


def gen_sine_embed_2d(pos: torch.Tensor, dims: int = 256) -> torch.Tensor:
    """Sine embedding of (..., 2) positions into (..., dims) as in DAB-DETR (y half first, then x)."""
    half = dims // 2
    dim_t = torch.arange(half, dtype=torch.float32, device=pos.device)
    dim_t = 10000 ** (2 * torch.div(dim_t, 2, rounding_mode="floor") / half)
    scale = 2 * math.pi
    out = []
    for coord in (pos[..., 1], pos[..., 0]):
        e = coord.float()[..., None] * scale / dim_t
        out.append(torch.stack((e[..., 0::2].sin(), e[..., 1::2].cos()), dim=-1).flatten(-2))
    return torch.cat(out, dim=-1).to(pos.dtype)
