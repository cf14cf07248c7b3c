"""Gaussian parametrisation shared by the lifter, encoder and head of GaussianFormer.

Conventions (as upstream, huang-yh/GaussianFormer): a Gaussian is stored "raw" as
``[xyz logits (3), scale logits (3), quaternion (4), opacity logit (0|1), semantics (C)]``; the mean is
``sigmoid(xyz)`` mapped to the scene range, the scale ``sigmoid(s)`` mapped to ``scale_range``.
Upstream builds the covariance as ``(S R)^T (S R) = R^T S^2 R`` with ``R`` the usual rotation
matrix of the quaternion, so the Gaussian's principal axes are the columns of ``A = R^T``; keypoints
are offset along the same axes. Everything here is closed form on the device (no CPU inverse).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Sequence

import torch

SIGMOID_CLAMP = 9.21  # upstream's safe_sigmoid clamps logits to +-9.21 (sigmoid in [1e-4, 1 - 1e-4])


def safe_sigmoid(x: torch.Tensor) -> torch.Tensor:
    """Sigmoid of logits clamped to +-9.21: keeps means and scales strictly inside their ranges."""
    return torch.sigmoid(x.clamp(-SIGMOID_CLAMP, SIGMOID_CLAMP))


def inverse_sigmoid(p: torch.Tensor, eps: float = 1e-4) -> torch.Tensor:
    """Logit of ``p`` clamped to ``[eps, 1 - eps]`` (upstream's safe_inverse_sigmoid)."""
    p = p.clamp(eps, 1.0 - eps)
    return torch.log(p / (1.0 - p))


@dataclass(frozen=True)
class GridSpec:
    """An axis-aligned voxel grid in the lidar frame: ``shape`` voxels of ``voxel_size`` metres from ``lower``."""

    shape: tuple[int, int, int]
    lower: tuple[float, float, float]
    voxel_size: float

    def __post_init__(self) -> None:
        if len(self.shape) != 3 or len(self.lower) != 3:
            raise ValueError(f"GridSpec needs 3-d shape and lower corner, got shape={self.shape} lower={self.lower}")
        if self.voxel_size <= 0 or min(self.shape) <= 0:
            raise ValueError(f"GridSpec needs positive voxel_size and shape, got {self.voxel_size}, {self.shape}")

    @property
    def upper(self) -> tuple[float, float, float]:
        return tuple(lo + n * self.voxel_size for lo, n in zip(self.lower, self.shape))  # type: ignore[return-value]

    @property
    def num_voxels(self) -> int:
        return self.shape[0] * self.shape[1] * self.shape[2]

    def voxel_centers(self, device: torch.device | None = None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """(X, Y, Z, 3) voxel centres in metres, built on ``device`` (call once, keep as a buffer)."""
        axes = [
            torch.arange(n, device=device, dtype=dtype) * self.voxel_size + (lo + 0.5 * self.voxel_size)
            for n, lo in zip(self.shape, self.lower)
        ]
        return torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1)


class GaussianSet(NamedTuple):
    """Activated Gaussians of one encoder layer, batched: what the splatting head consumes.

    means (B, G, 3) metres; scales (B, G, 3) metres; rotations (B, G, 4) unit quaternions (w, x, y, z);
    opacities (B, G, 1) in (0, 1) or (B, G, 0) when the config has no opacity; semantics (B, G, C).
    """

    means: torch.Tensor
    scales: torch.Tensor
    rotations: torch.Tensor
    opacities: torch.Tensor
    semantics: torch.Tensor


# Grid arithmetic below works axis by axis with Python scalars: building small constant tensors with
# ``new_tensor`` / ``torch.tensor(..., device=cuda)`` would be a blocking host-to-device copy (a sync).

def unit_to_range(unit: torch.Tensor, lower: Sequence[float], upper: Sequence[float]) -> torch.Tensor:
    """Map ``unit`` in [0, 1]^3 (last dim) to the box ``[lower, upper)``."""
    return torch.stack([unit[..., i] * (upper[i] - lower[i]) + lower[i] for i in range(3)], dim=-1)


def voxel_index(points: torch.Tensor, lower: Sequence[float], voxel_size: float, shape: Sequence[int]) -> torch.Tensor:
    """Integer voxel coordinates (..., 3) of metric points, floored and clamped into ``shape``."""
    return torch.stack(
        [torch.floor((points[..., i] - lower[i]) / voxel_size).long().clamp(0, shape[i] - 1) for i in range(3)], dim=-1
    )


def inside_grid(index: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """Whether integer coordinates (..., 3) lie inside ``shape``."""
    inside = (index >= 0).all(-1)
    for i in range(3):
        inside = inside & (index[..., i] < shape[i])
    return inside


def linear_voxel_index(index: torch.Tensor, shape: Sequence[int], batch: torch.Tensor | int = 0) -> torch.Tensor:
    """Key ((b * X + x) * Y + y) * Z + z of integer coordinates (..., 3)."""
    return ((batch * shape[0] + index[..., 0]) * shape[1] + index[..., 1]) * shape[2] + index[..., 2]


def cube_offsets(radius: int, device: torch.device | None = None) -> torch.Tensor:
    """((2r+1)^3, 3) integer offsets from -r to r in lexicographic (dx, dy, dz) order, built on ``device``."""
    rng = torch.arange(-radius, radius + 1, device=device)
    return torch.stack(torch.meshgrid(rng, rng, rng, indexing="ij"), dim=-1).reshape(-1, 3)


def quaternion_to_rotation(q: torch.Tensor) -> torch.Tensor:
    """(..., 4) quaternions (w, x, y, z), normalised here, -> (..., 3, 3) rotation matrices."""
    q = torch.nn.functional.normalize(q, dim=-1)
    w, x, y, z = q.unbind(-1)
    rows = (
        1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y),
        2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x),
        2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y),
    )
    return torch.stack(rows, dim=-1).unflatten(-1, (3, 3))


def gaussian_axes(q: torch.Tensor) -> torch.Tensor:
    """(..., 3, 3) matrix whose columns are the Gaussian's principal axes (``R^T``, upstream's convention)."""
    return quaternion_to_rotation(q).transpose(-1, -2)


def covariance(scales: torch.Tensor, rotations: torch.Tensor) -> torch.Tensor:
    """Sigma = A diag(s^2) A^T, (..., 3, 3)."""
    axes = gaussian_axes(rotations)
    return (axes * scales.square().unsqueeze(-2)) @ axes.transpose(-1, -2)


def precision_matrix(scales: torch.Tensor, rotations: torch.Tensor) -> torch.Tensor:
    """Sigma^-1 = A diag(s^-2) A^T in closed form, (..., 3, 3); replaces upstream's ``Cov.cpu().inverse()``."""
    axes = gaussian_axes(rotations)
    return (axes * scales.square().reciprocal().unsqueeze(-2)) @ axes.transpose(-1, -2)
