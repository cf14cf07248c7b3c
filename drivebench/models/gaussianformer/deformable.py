"""Deformable feature aggregation from the 6 cameras into each Gaussian (upstream DeformableFeatureAggregation).

Keypoints around each Gaussian (fixed + learned offsets scaled by its scales and turned by its
rotation) are projected with ``lidar2img``; projections behind a camera or outside the valid image
region get no weight; per-group weights are normalised jointly over keypoints x cameras x levels.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from drivebench.models.gaussianformer.geometry import GaussianSet, gaussian_axes, safe_sigmoid
from drivebench.models.common.sparse4d import linear_relu_ln
from drivebench.models.ops import deformable_aggregation, masked_point_softmax
from drivebench.models.ops.deformable_aggregation import AGGREGATION_IMPLS

# upstream's 7 fixed keypoints: the centre and +-0.45 of the scale along each principal axis
FIXED_KEYPOINTS = ((0.0, 0.0, 0.0), (0.45, 0.0, 0.0), (-0.45, 0.0, 0.0), (0.0, 0.45, 0.0), (0.0, -0.45, 0.0),
                   (0.0, 0.0, 0.45), (0.0, 0.0, -0.45))
MIN_DEPTH = 1e-5


class GaussianKeypoints(nn.Module):
    """Keypoints (B, G, P, 3) in metres: fixed offsets plus ``num_learnable`` offsets in (-0.5, 0.5), all
    multiplied by the Gaussian's scales, rotated onto its axes and added to its mean."""

    def __init__(self, embed_dims: int, num_learnable: int = 2) -> None:
        super().__init__()
        self.register_buffer("fixed", torch.tensor(FIXED_KEYPOINTS), persistent=False)
        self.num_learnable = num_learnable
        self.learnable_fc = nn.Linear(embed_dims, num_learnable * 3) if num_learnable else None
        if self.learnable_fc is not None:
            nn.init.xavier_uniform_(self.learnable_fc.weight)
            nn.init.zeros_(self.learnable_fc.bias)

    @property
    def num_points(self) -> int:
        return self.fixed.shape[0] + self.num_learnable

    def forward(self, gaussians: GaussianSet, instance_feature: torch.Tensor) -> torch.Tensor:
        b, g = gaussians.means.shape[:2]
        offsets = self.fixed.to(gaussians.means.dtype).expand(b, g, -1, -1)
        if self.learnable_fc is not None:
            learned = safe_sigmoid(self.learnable_fc(instance_feature)).view(b, g, self.num_learnable, 3) - 0.5
            offsets = torch.cat([offsets, learned], dim=2)
        offsets = offsets * gaussians.scales.unsqueeze(2)
        axes = gaussian_axes(gaussians.rotations)  # (B, G, 3, 3), columns = principal axes
        return gaussians.means.unsqueeze(2) + torch.einsum("bgij,bgpj->bgpi", axes, offsets)


def project_to_cameras(
    points: torch.Tensor, lidar2img: torch.Tensor, img_shape: torch.Tensor, padded_hw: tuple[int, int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Project lidar-frame points (B, Q, P, 3) into N cameras.

    Returns ``uv`` (B, Q, P, N, 2) as (x, y) normalised by the padded image size (what the feature maps
    cover) and ``visible`` (B, Q, P, N): in front of the camera and inside the valid (h, w) region of
    ``img_shape`` (B, N, 2). Upstream normalises by the image size and tests (0, 1); same thing unpadded.
    """
    homo = torch.cat([points, torch.ones_like(points[..., :1])], dim=-1)
    cam = torch.einsum("bnij,bqpj->bqpni", lidar2img[..., :3, :].to(points.dtype), homo)
    depth = cam[..., 2]
    pix = cam[..., :2] / depth.clamp(min=MIN_DEPTH).unsqueeze(-1)
    hw = img_shape.to(points.dtype)[:, None, None]  # (B, 1, 1, N, 2) as (h, w)
    visible = (
        (depth > MIN_DEPTH)
        & (pix[..., 0] > 0) & (pix[..., 0] < hw[..., 1])
        & (pix[..., 1] > 0) & (pix[..., 1] < hw[..., 0])
    )
    uv = torch.stack([pix[..., 0] / padded_hw[1], pix[..., 1] / padded_hw[0]], dim=-1)
    return uv, visible


class DeformableAggregation(nn.Module):
    """Sample image features at each Gaussian's keypoints; output ``cat([proj(features), instance_feature])``.

    Args:
        embed_dims: channel width d (the FPN width).
        num_groups: channel groups with their own weights (4 upstream).
        num_levels / num_cams: FPN levels and cameras.
        num_learnable_points: learned keypoints added to the 7 fixed ones (2 upstream).
        attn_drop: training-time probability to drop each (point, camera, level, group) weight (0.15).
        use_checkpoint: recompute the feature sampling in backward instead of keeping the sampled
            (B*N, C, Q, P) tensors of every level (large at 144k Gaussians).
        impl: how the sampling runs (``drivebench.models.ops.deformable_aggregation``: grid_sample |
            chunked | compiled | auto: corner gathers traced into the graph where a compile unit holds the
            aggregation, ``grid_sample`` where it runs eagerly).
    """

    def __init__(
        self,
        embed_dims: int,
        num_groups: int = 4,
        num_levels: int = 4,
        num_cams: int = 6,
        num_learnable_points: int = 2,
        attn_drop: float = 0.15,
        use_checkpoint: bool = False,
        impl: str = "grid_sample",
    ) -> None:
        super().__init__()
        if impl not in AGGREGATION_IMPLS:
            raise ValueError(f"aggregation={impl!r} is not valid; choose one of: {', '.join(AGGREGATION_IMPLS)}")
        self.impl = impl
        if embed_dims % num_groups:
            raise ValueError(f"embed_dims={embed_dims} is not divisible by num_groups={num_groups}")
        self.num_groups, self.num_levels, self.num_cams = num_groups, num_levels, num_cams
        self.attn_drop = attn_drop
        self.use_checkpoint = use_checkpoint
        self.keypoints = GaussianKeypoints(embed_dims, num_learnable_points)
        self.camera_encoder = linear_relu_ln(embed_dims, 1, 2, 12)
        self.weights_fc = nn.Linear(embed_dims, num_groups * num_levels * self.keypoints.num_points)
        self.output_proj = nn.Linear(embed_dims, embed_dims)
        for layer in self.camera_encoder:  # upstream's encoder init: xavier on the aggregation's linears
            if isinstance(layer, nn.Linear):
                nn.init.xavier_uniform_(layer.weight)
        nn.init.zeros_(self.weights_fc.weight)
        nn.init.zeros_(self.weights_fc.bias)
        nn.init.xavier_uniform_(self.output_proj.weight)
        nn.init.zeros_(self.output_proj.bias)

    def _weight_logits(self, feature: torch.Tensor, lidar2img: torch.Tensor) -> torch.Tensor:
        """(B, G, P, N, L, groups) logits; the camera embedding sees the 3x4 projection (12 numbers)."""
        b, g = feature.shape[:2]
        n, p = lidar2img.shape[1], self.keypoints.num_points
        if n != self.num_cams:
            raise ValueError(f"batch has {n} cameras, the model was built for num_cams={self.num_cams}")
        camera_embed = self.camera_encoder(lidar2img[:, :, :3, :].reshape(b, n, 12).to(feature.dtype))
        logits = self.weights_fc(feature.unsqueeze(2) + camera_embed.unsqueeze(1))
        logits = logits.view(b, g, n, self.num_levels, p, self.num_groups)
        return logits.permute(0, 1, 4, 2, 3, 5)

    def forward(
        self,
        instance_feature: torch.Tensor,
        anchor_embed: torch.Tensor,
        gaussians: GaussianSet,
        feature_maps: list[torch.Tensor],
        lidar2img: torch.Tensor,
        img_shape: torch.Tensor,
        padded_hw: tuple[int, int],
    ) -> torch.Tensor:
        if len(feature_maps) != self.num_levels:
            raise ValueError(f"{len(feature_maps)} feature levels given, the model was built for {self.num_levels}")
        keypoints = self.keypoints(gaussians, instance_feature)
        uv, visible = project_to_cameras(keypoints, lidar2img, img_shape, padded_hw)
        logits = self._weight_logits(instance_feature + anchor_embed, lidar2img)
        if self.training and self.attn_drop > 0:
            dropped = torch.rand_like(logits) < self.attn_drop
            logits = logits.masked_fill(dropped, float("-inf"))
        weights = masked_point_softmax(logits, visible)
        if self.use_checkpoint and torch.is_grad_enabled():
            features = checkpoint(deformable_aggregation, feature_maps, uv, weights, self.impl, use_reentrant=False)
        else:
            features = deformable_aggregation(feature_maps, uv, weights, self.impl)
        return torch.cat([self.output_proj(features), instance_feature], dim=-1)
