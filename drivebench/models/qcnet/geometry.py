"""Planar geometry shared by the encoders, the decoder and the CPU batch builder."""

from __future__ import annotations

import math

import numpy as np
import torch


def wrap_angle(angle: torch.Tensor) -> torch.Tensor:
    """Map angles to [-pi, pi)."""
    return (angle + math.pi) % (2 * math.pi) - math.pi


def wrap_angle_np(angle: np.ndarray) -> np.ndarray:
    """numpy twin of :func:`wrap_angle` (used by the CPU batch builder)."""
    return (angle + np.pi) % (2 * np.pi) - np.pi


def angle_between_2d_vectors(ctr_vector: torch.Tensor, nbr_vector: torch.Tensor) -> torch.Tensor:
    """Signed angle from ``ctr_vector`` to ``nbr_vector`` (both ``(..., 2)``)."""
    cross = ctr_vector[..., 0] * nbr_vector[..., 1] - ctr_vector[..., 1] * nbr_vector[..., 0]
    dot = ctr_vector[..., 0] * nbr_vector[..., 0] + ctr_vector[..., 1] * nbr_vector[..., 1]
    return torch.atan2(cross, dot)


def relative_pose(
    pos_src: torch.Tensor,
    pos_dst: torch.Tensor,
    theta_src: torch.Tensor,
    theta_dst: torch.Tensor,
) -> torch.Tensor:
    """QCNet's relative spatial encoding of ``src`` seen from ``dst``: (distance, bearing, rel. heading).

    The bearing is measured from the heading of ``dst``, so the encoding is invariant to the global
    frame (the "query-centric" part of QCNet). Returns ``(E, 3)``.
    """
    rel = pos_src - pos_dst
    heading_dst = torch.stack([theta_dst.cos(), theta_dst.sin()], dim=-1)
    return torch.stack(
        [
            torch.linalg.vector_norm(rel, dim=-1),
            angle_between_2d_vectors(heading_dst, rel),
            wrap_angle(theta_src - theta_dst),
        ],
        dim=-1,
    )
