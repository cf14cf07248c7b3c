"""The Sparse4D-style decoder shared by SparseDrive's detection and online-map heads.

Each of ``num_layers`` decoder layers runs: temporal attention (layers after the single-frame
ones) -> self attention -> norm -> deformable feature aggregation -> FFN -> norm -> refinement.
The detection head drops the first layer's self attention (upstream ``operation_order[2:]``).
After the single-frame layers the instance bank swaps in the temporal instances.

Heads differ only in their parts (anchor encoder, keypoints, refinement, bank), which the small
builders at the bottom of this file assemble.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

from drivebench.models.common.sparse4d import AsymmetricFFN, Scale, linear_relu_ln
from drivebench.models.sparsedrive.blocks import (
    BoxKeypoints,
    DeformableFeatureAggregation,
    PolylineKeypoints,
    ResidualAttention,
    bias_init_with_prob,
)
from drivebench.models.sparsedrive.boxes import COS_YAW, H, SIN_YAW, VX, X, Z, project_box_anchors, project_points_2d
from drivebench.models.sparsedrive.denoising import DenoisingOutput, DenoisingQueries, denoising_attention_mask
from drivebench.models.sparsedrive.instance_bank import InstanceBank, TemporalContext


@dataclass
class HeadOutput:
    """Per decoder layer predictions plus the final instances (what motion/planning reads)."""

    classification: list[torch.Tensor] = field(default_factory=list)  # (B, Q, num_cls) logits
    prediction: list[torch.Tensor] = field(default_factory=list)  # (B, Q, D) anchor states
    quality: list[torch.Tensor | None] = field(default_factory=list)  # (B, Q, 2) or None
    instance_feature: torch.Tensor | None = None  # (B, Q, C) after the last layer
    anchor_embed: torch.Tensor | None = None  # (B, Q, C)
    instance_id: torch.Tensor | None = None  # (B, Q) track ids (the detection head, both stages as upstream)
    dn: DenoisingOutput | None = None  # predictions of the noisy queries (training with denoising)


class SparseInstanceHead(nn.Module):
    """Decoder over a bank of sparse instances (see module docstring)."""

    def __init__(
        self,
        bank: InstanceBank,
        anchor_encoder: nn.Module,
        make_keypoints: Callable[[], nn.Module],
        make_refine: Callable[[], nn.Module],
        dims: int = 256,
        num_layers: int = 6,
        num_single_frame: int = 1,
        decouple_attn: bool = True,
        first_layer_self_attn: bool = True,
        num_heads: int = 8,
        dropout: float = 0.1,
        num_groups: int = 8,
        num_levels: int = 4,
        num_cams: int = 6,
        dfa_attn_drop: float = 0.15,
        ffn_ratio: int = 4,
        aggregation: str = "grid_sample",
    ) -> None:
        super().__init__()
        self.bank = bank
        self.anchor_encoder = anchor_encoder
        self.dims, self.num_layers, self.num_single_frame = dims, num_layers, num_single_frame
        self.decouple_attn = decouple_attn
        attn_dims = 2 * dims if decouple_attn else dims
        self.temp_attn = nn.ModuleList(
            [ResidualAttention(attn_dims, num_heads, dropout) if i >= num_single_frame else nn.Identity() for i in range(num_layers)]
        )
        self.self_attn = nn.ModuleList(
            [ResidualAttention(attn_dims, num_heads, dropout) if (i > 0 or first_layer_self_attn) else nn.Identity() for i in range(num_layers)]
        )
        self.attn_norm = nn.ModuleList(
            [nn.LayerNorm(dims) if (i > 0 or first_layer_self_attn) else nn.Identity() for i in range(num_layers)]
        )
        self.dfa = nn.ModuleList(
            [DeformableFeatureAggregation(dims, make_keypoints(), num_groups, num_levels, num_cams, dfa_attn_drop,
                                          aggregation) for _ in range(num_layers)]
        )
        self.ffn = nn.ModuleList([AsymmetricFFN(2 * dims, dims, ffn_ratio * dims, dropout) for _ in range(num_layers)])
        self.ffn_norm = nn.ModuleList([nn.LayerNorm(dims) for _ in range(num_layers)])
        self.refine = nn.ModuleList([make_refine() for _ in range(num_layers)])
        if decouple_attn:
            self.fc_before = nn.Linear(dims, 2 * dims, bias=False)
            self.fc_after = nn.Linear(2 * dims, dims, bias=False)
        self._xavier_init()

    def _xavier_init(self) -> None:
        groups = [self.temp_attn, self.self_attn, self.ffn] + [dfa.camera_encoder for dfa in self.dfa]
        for group in groups:
            for p in group.parameters():
                if p.dim() > 1:
                    nn.init.xavier_uniform_(p)

    def reset_state(self) -> None:
        self.bank.reset_state()

    def compile_units(self) -> dict[str, nn.Module]:
        """The per-layer dense parts (``compile_scope=heads``; ``aggregation`` takes the ``dfa`` ones), by module
        path: the anchor encoder, and per layer the attention that is not an Identity, the deformable aggregation,
        the FFN and the refinement. Each takes the queries as they are and returns a tensor, so the bank's
        top-k merge, the denoising mask and the ``torch.where`` on history stay outside, eagerly. The
        LayerNorms after attention and FFN stay eager too (one kernel each; joining them to a unit would
        need a module that changes the state_dict's names)."""
        units: dict[str, nn.Module] = {"anchor_encoder": self.anchor_encoder}
        for i in range(self.num_layers):
            for kind in ("temp_attn", "self_attn", "dfa", "ffn", "refine"):
                module = getattr(self, kind)[i]
                if not isinstance(module, nn.Identity):
                    units[f"{kind}.{i}"] = module
        return units

    def attend(self, layer: nn.Module, query: torch.Tensor, key: torch.Tensor | None, value: torch.Tensor | None,
               query_pos: torch.Tensor, key_pos: torch.Tensor | None, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Attention with decoupled content/position (512-d q/pos concat) when ``decouple_attn``."""
        if not self.decouple_attn:
            return layer(query, key, value, query_pos, key_pos, attn_mask=attn_mask)
        query = torch.cat([query, query_pos], dim=-1)
        if key is not None and key_pos is not None:
            key = torch.cat([key, key_pos], dim=-1)
        if value is not None:
            value = self.fc_before(value)
        return self.fc_after(layer(query, key, value, attn_mask=attn_mask))

    def forward(self, feature_maps: list[torch.Tensor], lidar2img: torch.Tensor, image_wh: torch.Tensor,
                ctx: TemporalContext, dn: DenoisingQueries | None = None) -> HeadOutput:
        """``dn``: noisy ground-truth queries appended after the learned ones (training only)."""
        b = feature_maps[0].shape[0]
        feature, anchor, temp_feature, temp_anchor = self.bank.get(b, ctx)
        n_query = feature.shape[1]
        self_mask = None
        if dn is not None:
            anchor = torch.cat([anchor, dn.anchor.to(anchor.dtype)], dim=1)
            feature = torch.cat([feature, feature.new_zeros(b, dn.anchor.shape[1], feature.shape[-1])], dim=1)
            self_mask = denoising_attention_mask(n_query, dn.anchor.shape[1], dn.group_size, feature.device)
        anchor_embed = self.anchor_encoder(anchor)
        temp_embed = self.anchor_encoder(temp_anchor) if temp_anchor is not None else None
        out = HeadOutput()
        n_temp = self.bank.num_temp
        valid = ctx.valid[:, None, None]
        for i in range(self.num_layers):
            if i >= self.num_single_frame:
                if n_temp == 0:  # a head without temporal instances: self attention, as upstream
                    feature = self.attend(self.temp_attn[i], feature, None, None, anchor_embed, None, self_mask)
                else:
                    # A slot without history (first step, or prev_exists False) attends to its own
                    # current temporal-slot queries; upstream self-attends on its very first step
                    # and otherwise reads the stale cache of another sequence. This way a reset
                    # slot computes exactly what a freshly started model computes.
                    key, key_pos = feature[:, :n_temp], anchor_embed[:, :n_temp]
                    if temp_feature is not None and temp_embed is not None:
                        key = torch.where(valid, temp_feature, key)
                        key_pos = torch.where(valid, temp_embed, key_pos)
                    feature = self.attend(self.temp_attn[i], feature, key, key, anchor_embed, key_pos)
            if not isinstance(self.self_attn[i], nn.Identity):
                feature = self.attend(self.self_attn[i], feature, None, feature, anchor_embed, None, self_mask)
                feature = self.attn_norm[i](feature)
            feature = self.dfa[i](feature, anchor, anchor_embed, feature_maps, lidar2img, image_wh)
            feature = self.ffn_norm[i](self.ffn[i](feature))
            anchor, cls, quality = self.refine[i](feature, anchor, anchor_embed, ctx.time_interval)
            out.prediction.append(anchor)
            out.classification.append(cls)
            out.quality.append(quality)
            if i + 1 == self.num_single_frame:
                merged_feat, merged_anchor = self.bank.update(feature[:, :n_query], anchor[:, :n_query],
                                                              cls[:, :n_query], temp_feature, temp_anchor, ctx.valid)
                feature = torch.cat([merged_feat, feature[:, n_query:]], dim=1)
                anchor = torch.cat([merged_anchor, anchor[:, n_query:]], dim=1)
            anchor_embed = self.anchor_encoder(anchor)
            if i + 1 > self.num_single_frame and temp_embed is not None:
                temp_embed = anchor_embed[:, :n_temp]
        if dn is not None:
            out.dn = DenoisingOutput([c[:, n_query:] for c in out.classification],
                                     [p[:, n_query:] for p in out.prediction], dn)
            out.classification = [c[:, :n_query] for c in out.classification]
            out.prediction = [p[:, :n_query] for p in out.prediction]
            out.quality = [q[:, :n_query] if q is not None else None for q in out.quality]
        out.instance_feature = feature[:, :n_query]
        out.anchor_embed = anchor_embed[:, :n_query]
        out.instance_id = self.bank.cache(out.instance_feature, anchor[:, :n_query], out.classification[-1])
        return out


# ---- detection parts --------------------------------------------------------------------------
class BoxAnchorEncoder(nn.Module):
    """Anchor state -> embedding: separate MLPs for centre, size, yaw and velocity, concatenated
    (upstream ``SparseBox3DEncoder`` in ``cat`` mode: [128, 32, 32, 64] of 256, 4 MLP blocks each)."""

    def __init__(self, dims: int, out_loops: int = 4) -> None:
        super().__init__()
        parts = [dims // 2, dims // 8, dims // 8]
        parts.append(dims - sum(parts))
        self.pos_fc = linear_relu_ln(parts[0], 1, out_loops, 3)
        self.size_fc = linear_relu_ln(parts[1], 1, out_loops, 3)
        self.yaw_fc = linear_relu_ln(parts[2], 1, out_loops, 2)
        self.vel_fc = linear_relu_ln(parts[3], 1, out_loops, 3)

    def forward(self, anchor: torch.Tensor) -> torch.Tensor:
        return torch.cat(
            [
                self.pos_fc(anchor[..., X : Z + 1]),
                self.size_fc(anchor[..., 3 : H + 1]),
                self.yaw_fc(anchor[..., SIN_YAW : COS_YAW + 1]),
                self.vel_fc(anchor[..., VX : VX + 3]),
            ],
            dim=-1,
        )


class BoxRefinement(nn.Module):
    """Refine the anchor state (residual on centre/size/yaw; velocity from a displacement over the
    frame interval), classify, and estimate quality (centerness, yawness)."""

    def __init__(self, dims: int, num_cls: int, with_quality: bool = True, state_dims: int = 11) -> None:
        super().__init__()
        self.layers = nn.Sequential(*linear_relu_ln(dims, 2, 2), nn.Linear(dims, state_dims), Scale(state_dims))
        self.cls_layers = nn.Sequential(*linear_relu_ln(dims, 1, 2), nn.Linear(dims, num_cls))
        nn.init.constant_(self.cls_layers[-1].bias, bias_init_with_prob(0.01))
        self.quality_layers = nn.Sequential(*linear_relu_ln(dims, 1, 2), nn.Linear(dims, 2)) if with_quality else None

    def forward(self, feature: torch.Tensor, anchor: torch.Tensor, anchor_embed: torch.Tensor,
                time_interval: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        fused = feature + anchor_embed
        delta = self.layers(fused).float()  # anchor states accumulate in float32 even under autocast
        anchor = anchor.float()
        geometry = delta[..., :VX] + anchor[..., :VX]
        velocity = delta[..., VX:] / time_interval.float()[:, None, None] + anchor[..., VX:]
        refined = torch.cat([geometry, velocity], dim=-1)
        cls = self.cls_layers(feature)
        quality = self.quality_layers(fused) if self.quality_layers is not None else None
        return refined, cls, quality


def build_detection_head(anchors: torch.Tensor, dims: int, num_cls: int, num_temp: int, num_layers: int,
                         num_single_frame: int, num_heads: int, num_groups: int, num_levels: int, num_cams: int,
                         num_learnable_pts: int = 6, confidence_decay: float = 0.6, track_ids: bool = False,
                         dropout: float = 0.1, aggregation: str = "grid_sample") -> SparseInstanceHead:
    """Sparse4D detection head as configured by ``sparsedrive_small``."""
    bank = InstanceBank(anchors, dims, num_temp, project_box_anchors, confidence_decay, feat_grad=False,
                        track_ids=track_ids)
    return SparseInstanceHead(
        bank, BoxAnchorEncoder(dims),
        make_keypoints=lambda: BoxKeypoints(dims, num_learnable_pts),
        make_refine=lambda: BoxRefinement(dims, num_cls),
        dims=dims, num_layers=num_layers, num_single_frame=num_single_frame, decouple_attn=True,
        first_layer_self_attn=False, num_heads=num_heads, dropout=dropout, num_groups=num_groups,
        num_levels=num_levels, num_cams=num_cams, aggregation=aggregation,
    )


# ---- map parts --------------------------------------------------------------------------------
class PolylineAnchorEncoder(nn.Module):
    """Flattened (x, y) polyline -> embedding (upstream ``SparsePoint3DEncoder``)."""

    def __init__(self, dims: int, num_sample: int = 20) -> None:
        super().__init__()
        self.pos_fc = linear_relu_ln(dims, 1, 2, 2 * num_sample)

    def forward(self, anchor: torch.Tensor) -> torch.Tensor:
        return self.pos_fc(anchor)


class PolylineRefinement(nn.Module):
    """Residual refinement of the polyline points and classification (no quality branch)."""

    def __init__(self, dims: int, num_sample: int, num_cls: int) -> None:
        super().__init__()
        self.layers = nn.Sequential(*linear_relu_ln(dims, 2, 2), nn.Linear(dims, 2 * num_sample), Scale(2 * num_sample))
        self.cls_layers = nn.Sequential(*linear_relu_ln(dims, 1, 2), nn.Linear(dims, num_cls))
        nn.init.constant_(self.cls_layers[-1].bias, bias_init_with_prob(0.01))

    def forward(self, feature: torch.Tensor, anchor: torch.Tensor, anchor_embed: torch.Tensor,
                time_interval: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        return self.layers(feature + anchor_embed).float() + anchor.float(), self.cls_layers(feature), None


def _project_polylines(anchor: torch.Tensor, prev2cur: torch.Tensor, dt: torch.Tensor) -> torch.Tensor:
    return project_points_2d(anchor, prev2cur)


def build_map_head(anchors: torch.Tensor, dims: int, num_cls: int, num_temp: int, num_layers: int,
                   num_single_frame: int, num_heads: int, num_groups: int, num_levels: int, num_cams: int,
                   num_sample: int = 20, num_learnable_pts: int = 3, fix_height: tuple[float, ...] = (0, 0.5, -0.5, 1, -1),
                   ground_height: float = -1.84023, confidence_decay: float = 0.6, dropout: float = 0.1,
                   aggregation: str = "grid_sample") -> SparseInstanceHead:
    """Sparse online-map head as configured by ``sparsedrive_small`` (no decoupled attention)."""
    bank = InstanceBank(anchors, dims, num_temp, _project_polylines, confidence_decay, feat_grad=True)
    return SparseInstanceHead(
        bank, PolylineAnchorEncoder(dims, num_sample),
        make_keypoints=lambda: PolylineKeypoints(dims, num_sample, num_learnable_pts, fix_height, ground_height),
        make_refine=lambda: PolylineRefinement(dims, num_sample, num_cls),
        dims=dims, num_layers=num_layers, num_single_frame=num_single_frame, decouple_attn=False,
        first_layer_self_attn=True, num_heads=num_heads, dropout=dropout, num_groups=num_groups,
        num_levels=num_levels, num_cams=num_cams, aggregation=aggregation,
    )
