"""MapTR's BEV encoder: learned BEV queries lifted from the cameras by one BEVFormer layer.

Layer order as upstream (``operation_order``): temporal self-attention, norm, GKT spatial
cross-attention, norm, FFN, norm (post-norm).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from drivebench.models.maptr.attention import FFN, TemporalSelfAttention
from drivebench.models.maptr.geometry import (
    PcRange,
    bev_reference_points_2d,
    pillar_reference_points_3d,
    project_to_cameras,
)
from drivebench.models.maptr.gkt import GeometrySpatialCrossAttention

# can_bus layout (batch contract / upstream): translation 0:3, quaternion 3:7, acceleration 7:10,
# rotation rate 10:13, velocity 13:16, patch angle in rad 16, in degrees 17.
CAN_BUS_DIMS = 18


class LearnedPositionalEncoding2D(nn.Module):
    """BEV position = [column embedding, row embedding] (mmdet's ``LearnedPositionalEncoding``)."""

    def __init__(self, bev_h: int, bev_w: int, num_feats: int) -> None:
        super().__init__()
        self.row_embed = nn.Embedding(bev_h, num_feats)
        self.col_embed = nn.Embedding(bev_w, num_feats)
        nn.init.uniform_(self.row_embed.weight)
        nn.init.uniform_(self.col_embed.weight)

    def forward(self) -> torch.Tensor:
        """(bev_h * bev_w, 2 * num_feats), row-major."""
        h, w = self.row_embed.num_embeddings, self.col_embed.num_embeddings
        col = self.col_embed.weight[None, :, :].expand(h, w, -1)
        row = self.row_embed.weight[:, None, :].expand(h, w, -1)
        return torch.cat([col, row], dim=-1).reshape(h * w, -1)


class BEVFormerLayer(nn.Module):
    """TSA -> norm -> GKT cross-attention -> norm -> FFN -> norm."""

    def __init__(self, embed_dims: int, ffn_dims: int, tsa_heads: int, tsa_points: int, gkt_heads: int,
                 gkt_kernel: tuple[int, int], dropout: float) -> None:
        super().__init__()
        self.temporal_attn = TemporalSelfAttention(embed_dims, tsa_heads, tsa_points, 2, dropout)
        self.norm1 = nn.LayerNorm(embed_dims)
        self.spatial_attn = GeometrySpatialCrossAttention(embed_dims, gkt_heads, gkt_kernel, dropout)
        self.norm2 = nn.LayerNorm(embed_dims)
        self.ffn = FFN(embed_dims, ffn_dims, dropout)
        self.norm3 = nn.LayerNorm(embed_dims)

    def forward(self, query: torch.Tensor, query_pos: torch.Tensor, prev_bev: torch.Tensor, ref_2d: torch.Tensor,
                bev_hw: tuple[int, int], cam_feats: torch.Tensor, feat_hw: tuple[int, int], ref_uv: torch.Tensor,
                visible: torch.Tensor) -> torch.Tensor:
        x = self.norm1(self.temporal_attn(query, query_pos, prev_bev, ref_2d, bev_hw))
        x = self.norm2(self.spatial_attn(x, cam_feats, feat_hw, ref_uv, visible))
        return self.norm3(self.ffn(x))


class BEVEncoder(nn.Module):
    """Image features of the 6 cameras -> BEV features (B, bev_h * bev_w, C).

    Args:
        embed_dims: C.
        bev_hw: (bev_h, bev_w) cells; bev_h runs along lidar y, bev_w along lidar x.
        pc_range: BEV extent (and pillar heights), metres in the lidar frame.
        num_cams: cameras (6 on nuScenes), each gets a learned embedding.
        num_points_in_pillar: z anchors per BEV cell (= GKT heads).
        rotate_center: pixel centre of the previous-BEV rotation (upstream default [100, 100]).
    """

    def __init__(
        self,
        embed_dims: int,
        bev_hw: tuple[int, int],
        pc_range: PcRange,
        num_cams: int = 6,
        num_layers: int = 1,
        ffn_dims: int = 512,
        tsa_heads: int = 8,
        tsa_points: int = 4,
        num_points_in_pillar: int = 4,
        gkt_kernel: tuple[int, int] = (3, 5),
        dropout: float = 0.1,
        rotate_center: tuple[float, float] = (100.0, 100.0),
    ) -> None:
        super().__init__()
        self.embed_dims = embed_dims
        self.bev_hw = (int(bev_hw[0]), int(bev_hw[1]))
        self.pc_range = tuple(float(v) for v in pc_range)
        self.num_cams = num_cams
        self.num_points_in_pillar = num_points_in_pillar
        self.rotate_center = tuple(rotate_center)
        h, w = self.bev_hw
        self.bev_embedding = nn.Embedding(h * w, embed_dims)
        self.positional_encoding = LearnedPositionalEncoding2D(h, w, embed_dims // 2)
        self.cams_embeds = nn.Parameter(torch.empty(num_cams, embed_dims))
        self.level_embeds = nn.Parameter(torch.empty(1, embed_dims))
        self.can_bus_mlp = nn.Sequential(
            nn.Linear(CAN_BUS_DIMS, embed_dims // 2), nn.ReLU(inplace=True),
            nn.Linear(embed_dims // 2, embed_dims), nn.ReLU(inplace=True),
            nn.LayerNorm(embed_dims),
        )
        self.layers = nn.ModuleList([
            BEVFormerLayer(embed_dims, ffn_dims, tsa_heads, tsa_points, num_points_in_pillar, gkt_kernel, dropout)
            for _ in range(num_layers)
        ])
        self.register_buffer("ref_2d", bev_reference_points_2d(h, w), persistent=False)
        self.register_buffer(
            "ref_3d", pillar_reference_points_3d(h, w, self.pc_range, num_points_in_pillar), persistent=False
        )

    def init_weights(self) -> None:
        """Upstream: Xavier on every matrix of the transformer, then the attention-specific inits."""
        for module in (self.can_bus_mlp, self.layers):
            for p in module.parameters():
                if p.dim() > 1:
                    nn.init.xavier_uniform_(p)
        for m in self.can_bus_mlp:
            if isinstance(m, nn.Linear):
                nn.init.zeros_(m.bias)
        for layer in self.layers:
            layer.temporal_attn.init_weights()
            layer.spatial_attn.init_weights()
        nn.init.normal_(self.cams_embeds)
        nn.init.normal_(self.level_embeds)

    def forward(
        self,
        cam_feats: torch.Tensor,
        lidar2img: torch.Tensor,
        image_hw: tuple[int, int],
        can_bus: torch.Tensor,
        prev_bev: torch.Tensor | None = None,
        prev_can_bus: torch.Tensor | None = None,
        prev_exists: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """
        Args:
            cam_feats: (B, N, C, H_f, W_f) single-level camera features.
            lidar2img: (B, N, 4, 4).
            image_hw: (H, W) of the padded input images.
            can_bus: (B, 18) absolute CAN bus of this frame (batch-contract layout).
            prev_bev: optional (B, bev_h * bev_w, C) BEV of the previous frame of each sample.
            prev_can_bus: (B, 18) CAN bus of that previous frame (needed with ``prev_bev``).
            prev_exists: optional bool (B,): where False, that sample is treated as having no
                previous BEV (upstream resets the history at scene starts).
        """
        b, n, c, fh, fw = cam_feats.shape
        if n != self.num_cams:
            raise ValueError(f"BEV encoder built for {self.num_cams} cameras, batch has {n}")
        bev_h, bev_w = self.bev_hw
        queries = self.bev_embedding.weight.to(cam_feats.dtype)[None].expand(b, -1, -1)
        bev_pos = self.positional_encoding().to(cam_feats.dtype)

        delta_xyz, delta_deg, has_prev = self._ego_motion(can_bus, prev_bev, prev_can_bus, prev_exists)
        can_in = torch.cat([delta_xyz, can_bus[:, 3:17], delta_deg[:, None]], dim=-1)
        queries = queries + self.can_bus_mlp(can_in.to(queries.dtype))[:, None, :]

        ref_cur = self.ref_2d.to(queries.dtype)[None].expand(b, -1, -1)
        if prev_bev is None:
            aligned, keep, ref_prev = None, None, ref_cur
        else:
            shift = self._bev_shift(delta_xyz[:, :2], can_bus[:, 16]).to(queries.dtype)
            aligned = self._rotate_bev(prev_bev.to(queries.dtype), delta_deg)
            keep = has_prev.to(queries.dtype)[:, None, None]
            ref_prev = ref_cur + shift[:, None, :]
        ref_2d = torch.stack([ref_prev, ref_cur], dim=1)

        ref_uv, visible = project_to_cameras(self.ref_3d, lidar2img, image_hw)  # (B, N, Q, Z, ...)
        ref_uv = ref_uv.to(queries.dtype)
        value = cam_feats.flatten(3).transpose(2, 3)  # (B, N, S, C)
        value = value + self.cams_embeds.to(value.dtype)[None, :, None, :] + self.level_embeds.to(value.dtype)[None]

        x = queries
        for layer in self.layers:
            # Without a previous BEV, TSA attends to the layer's own input twice (upstream).
            prev = x if aligned is None else keep * aligned + (1 - keep) * x
            x = layer(x, bev_pos, prev, ref_2d, (bev_h, bev_w), value, (fh, fw), ref_uv, visible)
        return x

    # ---- ego motion (only used with a previous BEV) --------------------------------------------
    @staticmethod
    def _ego_motion(can_bus: torch.Tensor, prev_bev: torch.Tensor | None, prev_can_bus: torch.Tensor | None,
                    prev_exists: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Translation (B, 3) and yaw change in degrees (B,) since the previous frame, zero without one;
        plus the float mask of samples that have one.

        Upstream feeds the CAN-bus MLP the translation and degree angle *relative to the previous
        frame*, and zeros for the first frame of a queue (every frame when training single frames).
        """
        b = can_bus.shape[0]
        if prev_bev is None:
            return can_bus.new_zeros(b, 3), can_bus.new_zeros(b), can_bus.new_zeros(b)
        if prev_can_bus is None:
            raise ValueError("MapTR got prev_bev without prev_can_bus; pass the previous frame's can_bus too")
        has_prev = can_bus.new_ones(b) if prev_exists is None else prev_exists.to(can_bus.dtype)
        delta_xyz = (can_bus[:, 0:3] - prev_can_bus[:, 0:3]) * has_prev[:, None]
        delta_deg = (can_bus[:, 17] - prev_can_bus[:, 17]) * has_prev
        return delta_xyz, delta_deg, has_prev

    def _bev_shift(self, delta_xy: torch.Tensor, ego_yaw_rad: torch.Tensor) -> torch.Tensor:
        """Ego translation expressed as a shift of normalised BEV coordinates (upstream's ``shift``)."""
        bev_h, bev_w = self.bev_hw
        grid_y = (self.pc_range[4] - self.pc_range[1]) / bev_h
        grid_x = (self.pc_range[3] - self.pc_range[0]) / bev_w
        length = delta_xy.norm(dim=-1)
        bev_angle = ego_yaw_rad - torch.atan2(delta_xy[:, 1], delta_xy[:, 0])
        shift_y = length * torch.cos(bev_angle) / grid_y / bev_h
        shift_x = length * torch.sin(bev_angle) / grid_x / bev_w
        return torch.stack([shift_x, shift_y], dim=-1)

    def _rotate_bev(self, bev: torch.Tensor, angle_deg: torch.Tensor) -> torch.Tensor:
        """Rotate each previous BEV by its yaw change about ``rotate_center`` (pixels), nearest
        sampling, zeros outside, counter-clockwise positive as ``torchvision...rotate``."""
        b, q, c = bev.shape
        bev_h, bev_w = self.bev_hw
        img = bev.transpose(1, 2).reshape(b, c, bev_h, bev_w)
        theta = angle_deg * (math.pi / 180.0)
        cos, sin = torch.cos(theta), torch.sin(theta)
        # Output pixel p samples input pixel R(-theta) (p - centre) + centre, in normalised coords.
        cx, cy = self.rotate_center
        ys, xs = torch.meshgrid(torch.arange(bev_h, device=bev.device, dtype=bev.dtype) + 0.5,
                                torch.arange(bev_w, device=bev.device, dtype=bev.dtype) + 0.5, indexing="ij")
        dx, dy = xs - cx, ys - cy
        # image y points down, so a counter-clockwise rotation on screen uses (x, -y)
        src_x = cos[:, None, None] * dx - sin[:, None, None] * dy + cx
        src_y = sin[:, None, None] * dx + cos[:, None, None] * dy + cy
        grid = torch.stack([src_x / bev_w * 2 - 1, src_y / bev_h * 2 - 1], dim=-1)
        out = F.grid_sample(img, grid, mode="nearest", padding_mode="zeros", align_corners=False)
        return out.reshape(b, c, q).transpose(1, 2)
