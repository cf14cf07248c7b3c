"""The Gaussian "anchor": raw per-Gaussian parameters, how they are initialised, decoded and embedded."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from drivebench.models.gaussianformer.geometry import GaussianSet, inverse_sigmoid, safe_sigmoid, unit_to_range
from drivebench.models.common.sparse4d import linear_relu_ln

SEMANTIC_ACTIVATIONS = ("identity", "softplus", "softmax")


@dataclass(frozen=True)
class AnchorLayout:
    """Where each quantity sits in a raw anchor vector, and how it is activated.

    Raw layout: xyz logits (3), scale logits (3), quaternion (4), opacity logit (1 if
    ``include_opacity``), semantic values (``semantic_dim``).
    """

    scene_lower: tuple[float, float, float]
    scene_upper: tuple[float, float, float]
    scale_range: tuple[float, float]
    include_opacity: bool
    semantic_dim: int
    semantics_activation: str = "softplus"

    def __post_init__(self) -> None:
        if self.semantics_activation not in SEMANTIC_ACTIVATIONS:
            raise ValueError(f"semantics_activation={self.semantics_activation!r}; valid: {SEMANTIC_ACTIVATIONS}")
        if not 0 < self.scale_range[0] < self.scale_range[1]:
            raise ValueError(f"scale_range must satisfy 0 < min < max, got {self.scale_range}")

    @property
    def opacity_dim(self) -> int:
        return int(self.include_opacity)

    @property
    def semantic_start(self) -> int:
        return 10 + self.opacity_dim

    @property
    def dim(self) -> int:
        return self.semantic_start + self.semantic_dim

    def decode(self, anchor: torch.Tensor) -> GaussianSet:
        """Raw anchors (B, G, dim) -> activated Gaussians in metres (upstream's refinement-module output)."""
        means = unit_to_range(safe_sigmoid(anchor[..., :3]), self.scene_lower, self.scene_upper)
        lo, hi = self.scale_range
        scales = lo + (hi - lo) * safe_sigmoid(anchor[..., 3:6])
        rotations = F.normalize(anchor[..., 6:10], dim=-1)
        opacities = safe_sigmoid(anchor[..., 10:self.semantic_start])
        semantics = anchor[..., self.semantic_start:self.dim]
        if self.semantics_activation == "softplus":
            semantics = F.softplus(semantics)
        elif self.semantics_activation == "softmax":
            semantics = semantics.softmax(dim=-1)
        return GaussianSet(means, scales, rotations, opacities, semantics)


class GaussianLifter(nn.Module):
    """N learnable Gaussians shared by all samples, plus their instance features.

    As upstream (``anchor_grad=True, feat_grad=False``): means uniform in the scene, scales uniform in
    the scale range, identity rotation, opacity 0.5, semantics ~ N(0, 1); the instance features are
    zeros and frozen (a non-trainable Parameter, so it is counted and checkpointed like upstream).
    """

    def __init__(self, num_gaussians: int, embed_dims: int, layout: AnchorLayout) -> None:
        super().__init__()
        self.layout = layout
        xyz = inverse_sigmoid(torch.rand(num_gaussians, 3))
        scale = inverse_sigmoid(torch.rand(num_gaussians, 3))
        rot = torch.zeros(num_gaussians, 4)
        rot[:, 0] = 1.0
        opacity = inverse_sigmoid(torch.full((num_gaussians, layout.opacity_dim), 0.5))
        semantics = torch.randn(num_gaussians, layout.semantic_dim)
        self.anchor = nn.Parameter(torch.cat([xyz, scale, rot, opacity, semantics], dim=-1))
        self.instance_feature = nn.Parameter(torch.zeros(num_gaussians, embed_dims), requires_grad=False)

    def forward(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Return (anchor (B, G, dim), instance_feature (B, G, d)) broadcast over the batch."""
        anchor = self.anchor.unsqueeze(0).expand(batch_size, -1, -1)
        feature = self.instance_feature.unsqueeze(0).expand(batch_size, -1, -1)
        return anchor, feature


class AnchorEncoder(nn.Module):
    """Embeds a raw anchor: one small MLP per quantity, summed, then an output MLP (SparseGaussian3DEncoder)."""

    def __init__(self, embed_dims: int, layout: AnchorLayout) -> None:
        super().__init__()
        self.layout = layout
        self.xyz_fc = linear_relu_ln(embed_dims, 1, 2, 3)
        self.scale_fc = linear_relu_ln(embed_dims, 1, 2, 3)
        self.rot_fc = linear_relu_ln(embed_dims, 1, 2, 4)
        self.opacity_fc = linear_relu_ln(embed_dims, 1, 2, 1) if layout.include_opacity else None
        self.semantics_fc = linear_relu_ln(embed_dims, 1, 2, layout.semantic_dim) if layout.semantic_dim else None
        self.output_fc = linear_relu_ln(embed_dims, 1, 2)

    def forward(self, anchor: torch.Tensor) -> torch.Tensor:
        lay = self.layout
        feat = self.xyz_fc(anchor[..., :3]) + self.scale_fc(anchor[..., 3:6]) + self.rot_fc(anchor[..., 6:10])
        if self.opacity_fc is not None:
            feat = feat + self.opacity_fc(anchor[..., 10:11])
        if self.semantics_fc is not None:
            feat = feat + self.semantics_fc(anchor[..., lay.semantic_start:lay.dim])
        return self.output_fc(feat)
