"""GaussianFormer's encoder: blocks that aggregate image features into the Gaussians and refine them.

Block 1: [deformable aggregation, FFN, norm, refine]; later blocks: [sparse 3D conv, norm, deformable
aggregation, FFN, norm, refine] (upstream ``operation_order`` of the paper configs).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from drivebench.models.common.sparse4d import AsymmetricFFN
from drivebench.models.gaussianformer.anchor import AnchorLayout
from drivebench.models.gaussianformer.deformable import DeformableAggregation
from drivebench.models.gaussianformer.refine import GaussianRefinement
from drivebench.models.gaussianformer.sparse_conv import GaussianSparseConv


@dataclass(frozen=True)
class CameraInputs:
    """What the aggregation needs from the batch: FPN features and the camera geometry."""

    feature_maps: list[torch.Tensor]  # per level (B, N, C, H_l, W_l)
    lidar2img: torch.Tensor  # (B, N, 4, 4)
    img_shape: torch.Tensor  # (B, N, 2) valid (h, w)
    padded_hw: tuple[int, int]  # (H, W) of the image tensor


@dataclass(frozen=True)
class EncoderBlockConfig:
    embed_dims: int
    ffn_dims: int
    num_groups: int = 4
    num_levels: int = 4
    num_cams: int = 6
    num_learnable_points: int = 2
    dropout: float = 0.1
    attn_drop: float = 0.15
    unit_xyz: tuple[float, float, float] = (4.0, 4.0, 1.0)
    sparse_voxel_size: float = 0.5
    sparse_kernel_size: int = 5
    sparse_out_proj: bool = True
    sparse_conv: str = "rulebook"
    aggregation_checkpoint: bool = False
    aggregation: str = "grid_sample"


class GaussianEncoderBlock(nn.Module):
    """One encoder block; ``use_sparse_conv`` adds the leading [sparse conv, norm] of blocks 2..n."""

    def __init__(self, cfg: EncoderBlockConfig, layout: AnchorLayout, use_sparse_conv: bool) -> None:
        super().__init__()
        d = cfg.embed_dims
        self.layout = layout
        self.sparse_conv = (
            GaussianSparseConv(d, layout.scene_lower, layout.scene_upper, cfg.sparse_voxel_size,
                               cfg.sparse_kernel_size, cfg.sparse_out_proj, impl=cfg.sparse_conv)
            if use_sparse_conv else None
        )
        self.sparse_norm = nn.LayerNorm(d) if use_sparse_conv else None
        self.aggregation = DeformableAggregation(d, cfg.num_groups, cfg.num_levels, cfg.num_cams,
                                                 cfg.num_learnable_points, cfg.attn_drop, cfg.aggregation_checkpoint,
                                                 cfg.aggregation)
        self.ffn = AsymmetricFFN(2 * d, d, cfg.ffn_dims, cfg.dropout, xavier_init=True)
        self.norm = nn.LayerNorm(d)
        self.refine = GaussianRefinement(d, layout, cfg.unit_xyz)

    def forward(self, instance_feature: torch.Tensor, anchor: torch.Tensor, anchor_embed: torch.Tensor,
                cams: CameraInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """Return the updated (instance_feature, raw anchor)."""
        gaussians = self.layout.decode(anchor)
        if self.sparse_conv is not None:
            instance_feature = self.sparse_norm(self.sparse_conv(instance_feature, gaussians.means))
        instance_feature = self.aggregation(instance_feature, anchor_embed, gaussians, cams.feature_maps,
                                            cams.lidar2img, cams.img_shape, cams.padded_hw)
        instance_feature = self.norm(self.ffn(instance_feature))
        anchor = self.refine(instance_feature, anchor_embed, anchor)
        return instance_feature, anchor
