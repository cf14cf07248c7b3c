"""Refinement of the Gaussians from their instance features (upstream SparseGaussian3DRefinementModule)."""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from drivebench.models.common.sparse4d import Scale, linear_relu_ln
from drivebench.models.gaussianformer.anchor import AnchorLayout
from drivebench.models.gaussianformer.geometry import safe_sigmoid


class GaussianRefinement(nn.Module):
    """Predict a new raw anchor from ``instance_feature + anchor_embed``.

    As in both paper configs (``restrict_xyz=True``, ``refine_manual=[0, 1, 2]``): only the mean is a
    residual update, bounded to ``+-unit_xyz`` metres (expressed in sigmoid-logit space as upstream:
    ``4 * unit / range``); scale, rotation, opacity and semantics are predicted afresh each layer.
    """

    def __init__(self, embed_dims: int, layout: AnchorLayout, unit_xyz: Sequence[float]) -> None:
        super().__init__()
        self.layout = layout
        extent = [hi - lo for lo, hi in zip(layout.scene_lower, layout.scene_upper)]
        self.register_buffer(
            "delta_logit_bound", torch.tensor([4.0 * u / e for u, e in zip(unit_xyz, extent)]), persistent=False
        )
        self.layers = nn.Sequential(
            *linear_relu_ln(embed_dims, 2, 2), nn.Linear(embed_dims, layout.dim), Scale(layout.dim)
        )

    def forward(self, instance_feature: torch.Tensor, anchor_embed: torch.Tensor, anchor: torch.Tensor) -> torch.Tensor:
        out = self.layers(instance_feature + anchor_embed)
        delta_xyz = (2.0 * safe_sigmoid(out[..., :3]) - 1.0) * self.delta_logit_bound
        xyz = anchor[..., :3] + delta_xyz
        rotation = F.normalize(out[..., 6:10], dim=-1)
        return torch.cat([xyz, out[..., 3:6], rotation, out[..., 10:]], dim=-1)
