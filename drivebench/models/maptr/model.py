"""MapTR v1 (Liao et al., ICLR 2023): online vectorised HD-map construction from 6 cameras.

cameras -> ResNet C5 + 1-level FPN -> BEV (1 BEVFormer layer with GKT) -> hierarchical-query
decoder -> per instance: 3 class logits and 20 ordered points. Reads the camera keys of
``docs/batch-contract.md``; the matching, losses and metrics live in
``drivebench.models.maptr.criterion`` / ``drivebench.models.common.map_*``.
"""

from __future__ import annotations

import contextlib
from typing import Any, Sequence

import torch
from torch import nn

from drivebench.models.common.backbone import FPN, MultiViewImageEncoder, NormEval, ResNetBackbone
from drivebench.models.common.map_metrics import MAP_CLASSES
from drivebench.models.maptr.bev_encoder import BEVEncoder
from drivebench.models.maptr.decoder import MapDecoder
from drivebench.models.maptr.geometry import denormalize_points
from drivebench.models.maptr.grid_mask import GridMask

__all__ = ["MAP_CLASSES", "MapTR"]


class MapTR(nn.Module):
    """Args (defaults = upstream ``maptr_tiny_r50_24e``):
        backbone: torchvision ResNet name; backbone_weights: optional local state_dict file.
        frozen_stages / norm_eval / width_div: see ``ResNetBackbone``.
        embed_dims: C; bev_hw: (bev_h, bev_w); pc_range: BEV extent in metres (lidar frame).
        encoder_layers / encoder_ffn / tsa_heads / tsa_points: the BEVFormer layer(s).
        num_points_in_pillar: z anchors (= GKT heads); gkt_kernel: integer window (kh, kw).
        decoder_layers / decoder_heads (self-attention) / decoder_deform_heads (BEV deformable
            attention) / decoder_ffn / decoder_points: the map decoder.
        num_vec: instance queries; num_pts: points per instance; num_classes: map classes.
        grid_mask: GridMask augmentation of the images in training (upstream on).
        head_fp32: run the BEV encoder and decoder in fp32 even under autocast, as upstream does
            under its fp16 recipe (``force_fp32`` on the head; only the image backbone is half).
        activation_checkpointing: recompute the backbone's residual blocks in backward (mmcv
            ``with_cp``; upstream MapTR trains without it).
    """

    def __init__(
        self,
        backbone: str = "resnet50",
        backbone_weights: str | None = None,
        frozen_stages: int = 1,
        norm_eval: NormEval = "with_weights",
        width_div: int = 1,
        embed_dims: int = 256,
        bev_hw: Sequence[int] = (200, 100),
        pc_range: Sequence[float] = (-15.0, -30.0, -2.0, 15.0, 30.0, 2.0),
        num_cams: int = 6,
        encoder_layers: int = 1,
        encoder_ffn: int = 512,
        tsa_heads: int = 8,
        tsa_points: int = 4,
        num_points_in_pillar: int = 4,
        gkt_kernel: Sequence[int] = (3, 5),
        decoder_layers: int = 6,
        decoder_heads: int = 8,
        decoder_ffn: int = 512,
        decoder_points: int = 4,
        decoder_deform_heads: int = 8,
        num_vec: int = 50,
        num_pts: int = 20,
        num_classes: int = 3,
        dropout: float = 0.1,
        grid_mask: bool = True,
        head_fp32: bool = True,
        activation_checkpointing: bool = False,
    ) -> None:
        super().__init__()
        if len(pc_range) != 6:
            raise ValueError(f"pc_range must be (x_min, y_min, z_min, x_max, y_max, z_max), got {pc_range}")
        self.pc_range = tuple(float(v) for v in pc_range)
        self.bev_hw = (int(bev_hw[0]), int(bev_hw[1]))
        self.num_vec, self.num_pts, self.num_classes = num_vec, num_pts, num_classes
        self.head_fp32 = head_fp32
        resnet = ResNetBackbone(backbone, out_indices=(3,), frozen_stages=frozen_stages, norm_eval=norm_eval,
                                weights=backbone_weights, width_div=width_div,
                                activation_checkpointing=activation_checkpointing)
        self.image_encoder = MultiViewImageEncoder(resnet, FPN(resnet.out_channels, embed_dims))
        self.grid_mask = GridMask() if grid_mask else nn.Identity()
        self.bev_encoder = BEVEncoder(
            embed_dims, self.bev_hw, self.pc_range, num_cams=num_cams, num_layers=encoder_layers,
            ffn_dims=encoder_ffn, tsa_heads=tsa_heads, tsa_points=tsa_points,
            num_points_in_pillar=num_points_in_pillar, gkt_kernel=(int(gkt_kernel[0]), int(gkt_kernel[1])),
            dropout=dropout,
        )
        self.decoder = MapDecoder(embed_dims, decoder_layers, decoder_heads, decoder_ffn, num_vec, num_pts,
                                  num_classes, decoder_points, dropout, decoder_deform_heads)
        self.bev_encoder.init_weights()
        self.decoder.init_weights()

    def backbone_parameters(self) -> list[nn.Parameter]:
        """Parameters of the image backbone (upstream trains them at 0.1x the learning rate)."""
        return list(self.image_encoder.backbone.parameters())

    #: the compiled image encoder sees the same image size every step (``accel.compile_shape_profile=auto`` keeps
    #: Dynamo's shape profile only for models whose compiled shapes depend on the batch)
    compiled_shapes_vary_with_data = False

    def compile_units(self) -> dict[str, nn.Module]:
        """What ``accel.compile`` compiles: the image backbone + FPN (static shapes, most FLOPs).
        The BEV encoder and decoder stay eager (their matching runs on the host)."""
        return {"image_encoder": self.image_encoder}

    def forward(
        self,
        batch: dict[str, Any],
        prev_bev: torch.Tensor | None = None,
        prev_can_bus: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        """
        Args:
            batch: ``img`` (B, N, 3, H, W), ``lidar2img`` (B, N, 4, 4), ``can_bus`` (B, 18); with a
                previous BEV also ``prev_exists`` (B,) if present.
            prev_bev / prev_can_bus: the previous frame's ``bev`` output and ``can_bus`` for temporal
                self-attention; None trains single frames as upstream's default (queue length 1).

        Returns:
            cls_logits (L, B, V, classes), pts_norm (L, B, V, P, 2) in [0, 1], pts (L, B, V, P, 2) in
            metres (lidar frame), one entry per decoder layer (the last is the prediction), and
            bev (B, bev_h * bev_w, C).
        """
        imgs = batch["img"]
        if imgs.ndim != 5:
            raise ValueError(f"batch['img'] must be (B, N, 3, H, W), got shape {tuple(imgs.shape)}")
        image_hw = (int(imgs.shape[-2]), int(imgs.shape[-1]))
        feats = self.image_encoder(self.grid_mask(imgs))[0]
        head_context = contextlib.nullcontext()
        if self.head_fp32 and torch.is_autocast_enabled(imgs.device.type):
            head_context = torch.autocast(device_type=imgs.device.type, enabled=False)
            feats = feats.float()
            prev_bev = prev_bev.float() if prev_bev is not None else None
        with head_context:
            bev = self.bev_encoder(feats, batch["lidar2img"], image_hw, batch["can_bus"], prev_bev=prev_bev,
                                   prev_can_bus=prev_can_bus, prev_exists=batch.get("prev_exists"))
            cls_logits, pts_norm = self.decoder(bev, self.bev_hw)
        return {
            "cls_logits": cls_logits,
            "pts_norm": pts_norm,
            "pts": denormalize_points(pts_norm, self.pc_range),
            "bev": bev,
        }
