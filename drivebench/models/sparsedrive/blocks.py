"""Layers shared by SparseDrive's heads: attention, deformable aggregation, keypoint generators, the auxiliary
depth head and GridMask (the MLP, scale and FFN bricks are ``drivebench.models.common.sparse4d``'s).

Written from SparseDrive's ``models/blocks.py`` / ``attention.py`` / ``*_blocks.py`` (swc-17/SparseDrive);
flash-attn is replaced by ``F.scaled_dot_product_attention`` and the CUDA aggregation op by
``drivebench.models.ops.deformable_aggregation``.
"""

from __future__ import annotations

import math
import random
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from drivebench.models.common.sparse4d import linear_relu_ln
from drivebench.models.ops import deformable_aggregation, masked_point_softmax
from drivebench.models.ops.deformable_aggregation import AGGREGATION_IMPLS
from drivebench.models.sparsedrive.boxes import COS_YAW, H, L, SIN_YAW, W, X, Z


def bias_init_with_prob(prob: float) -> float:
    """Logit bias that makes a sigmoid output ``prob`` at init (focal-loss practice)."""
    return float(-math.log((1 - prob) / prob))


class ResidualAttention(nn.Module):
    """Multi-head attention with the identity added back, as SparseDrive's ``MultiheadFlashAttention``.

    ``query + query_pos`` attends to ``key + key_pos``; ``value`` defaults to the key before its
    positional term and the output is ``query + dropout(attn)``. With ``key=None`` it is
    self-attention. ``key_valid`` (B, S) masks keys out and ``attn_mask`` (Nq, S) masks query-key
    pairs (True = attend; both may be given).
    """

    def __init__(self, dims: int, num_heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        if dims % num_heads:
            raise ValueError(f"attention dims {dims} not divisible by num_heads {num_heads}")
        self.dims, self.num_heads, self.dropout = dims, num_heads, dropout
        self.in_proj_weight = nn.Parameter(torch.empty(3 * dims, dims))
        self.in_proj_bias = nn.Parameter(torch.zeros(3 * dims))
        self.out_proj = nn.Linear(dims, dims)
        self.out_drop = nn.Dropout(dropout)
        nn.init.xavier_uniform_(self.in_proj_weight)
        nn.init.zeros_(self.out_proj.bias)

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor | None = None,
        value: torch.Tensor | None = None,
        query_pos: torch.Tensor | None = None,
        key_pos: torch.Tensor | None = None,
        key_valid: torch.Tensor | None = None,
        attn_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if key is None:
            key = query
            if key_pos is None:
                key_pos = query_pos
        if value is None:
            value = key
        identity = query
        if query_pos is not None:
            query = query + query_pos
        if key_pos is not None:
            key = key + key_pos
        w_q, w_k, w_v = self.in_proj_weight.chunk(3)
        b_q, b_k, b_v = self.in_proj_bias.chunk(3)
        b, nq, _ = query.shape
        heads, hd = self.num_heads, self.dims // self.num_heads
        q = F.linear(query, w_q, b_q).view(b, nq, heads, hd).transpose(1, 2)
        k = F.linear(key, w_k, b_k).view(b, key.shape[1], heads, hd).transpose(1, 2)
        v = F.linear(value, w_v, b_v).view(b, value.shape[1], heads, hd).transpose(1, 2)
        mask = None if key_valid is None else key_valid[:, None, None, :]
        if attn_mask is not None:
            mask = attn_mask if mask is None else mask & attn_mask
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                             dropout_p=self.dropout if self.training else 0.0)
        out = self.out_proj(out.transpose(1, 2).reshape(b, nq, self.dims))
        return identity + self.out_drop(out)


class BoxKeypoints(nn.Module):
    """3D keypoints of a box anchor: fixed fractions of its size plus learned ones, rotated by yaw.

    Upstream ``SparseBox3DKeyPointsGenerator``: 7 fixed (centre and the six face centres at 0.45 of
    the size) + 6 learned (sigmoid - 0.5 of the size) = 13 keypoints.
    """

    def __init__(self, dims: int, num_learnable: int = 6, fix_scale: Sequence[Sequence[float]] | None = None) -> None:
        super().__init__()
        if fix_scale is None:
            fix_scale = ((0, 0, 0), (0.45, 0, 0), (-0.45, 0, 0), (0, 0.45, 0), (0, -0.45, 0), (0, 0, 0.45), (0, 0, -0.45))
        self.register_buffer("fix_scale", torch.tensor(fix_scale, dtype=torch.float32), persistent=False)
        self.num_learnable = num_learnable
        self.num_pts = len(fix_scale) + num_learnable
        self.learnable_fc = nn.Linear(dims, num_learnable * 3) if num_learnable else None
        if self.learnable_fc is not None:
            nn.init.xavier_uniform_(self.learnable_fc.weight)
            nn.init.zeros_(self.learnable_fc.bias)

    def forward(self, anchor: torch.Tensor, instance_feature: torch.Tensor) -> torch.Tensor:
        b, q = anchor.shape[:2]
        anchor = anchor.float()  # geometry in float32 even under autocast
        # box frame: x along the heading (length l), y across (width w), z up
        # slices, not a list index: a list becomes a tensor constant in the compiled graph, which the AOTAutograd
        # cache cannot save (b61: this unit re-traced on every warm start, ~25 s)
        size = torch.stack((anchor[..., L], anchor[..., W], anchor[..., H]), dim=-1)[..., None, :].exp()
        pts = self.fix_scale * size
        if self.learnable_fc is not None:
            learned = self.learnable_fc(instance_feature).float().view(b, q, self.num_learnable, 3).sigmoid() - 0.5
            pts = torch.cat([pts, learned * size], dim=-2)
        cos, sin = anchor[..., None, COS_YAW], anchor[..., None, SIN_YAW]
        x = pts[..., 0] * cos - pts[..., 1] * sin
        y = pts[..., 0] * sin + pts[..., 1] * cos
        return torch.stack([x, y, pts[..., 2]], dim=-1) + anchor[..., None, X : Z + 1]


class PolylineKeypoints(nn.Module):
    """3D keypoints of a map polyline anchor (upstream ``SparsePoint3DKeyPointsGenerator``).

    Around each of the ``num_sample`` points, ``num_learnable`` learned (x, y) offsets at each of
    the fixed heights above the ground: 20 x 5 x 3 = 300 keypoints upstream.
    """

    def __init__(self, dims: int, num_sample: int = 20, num_learnable: int = 3,
                 fix_height: Sequence[float] = (0, 0.5, -0.5, 1, -1), ground_height: float = -1.84023) -> None:
        super().__init__()
        if num_learnable <= 0:
            raise ValueError("PolylineKeypoints needs num_learnable >= 1 (its keypoints are learned offsets)")
        self.num_sample, self.num_learnable = num_sample, num_learnable
        self.register_buffer("heights", torch.tensor(fix_height, dtype=torch.float32) + ground_height, persistent=False)
        self.num_pts = num_sample * len(fix_height) * num_learnable
        self.learnable_fc = nn.Linear(dims, self.num_pts * 2)
        nn.init.xavier_uniform_(self.learnable_fc.weight)
        nn.init.zeros_(self.learnable_fc.bias)

    def forward(self, anchor: torch.Tensor, instance_feature: torch.Tensor) -> torch.Tensor:
        b, q, _ = anchor.shape
        n_h = self.heights.numel()
        pts = anchor.float().view(b, q, self.num_sample, 1, 1, 2)
        offset = self.learnable_fc(instance_feature).float().view(b, q, self.num_sample, n_h, self.num_learnable, 2)
        xy = pts + offset
        z = self.heights.to(xy.dtype).view(1, 1, 1, n_h, 1, 1).expand(b, q, self.num_sample, n_h, self.num_learnable, 1)
        return torch.cat([xy, z], dim=-1).flatten(2, 4)


class DeformableFeatureAggregation(nn.Module):
    """Sample multi-camera, multi-level image features at an instance's keypoints (Sparse4D DFA).

    Keypoints from the anchor are projected with ``lidar2img``; per (keypoint, camera, level,
    group) weights come from the instance feature + anchor embedding + a camera embedding and are
    softmaxed jointly over (keypoint, camera, level), as upstream. The output is concatenated with
    the input feature (``residual_mode="cat"``) and goes to a 2x-wide FFN. ``impl`` picks how the
    sampling runs (``drivebench.models.ops.deformable_aggregation``: grid_sample | chunked | compiled | auto; auto
    traces the corner gathers where this module is a compiled unit, ``compile_scope=aggregation`` or ``heads``,
    else grid_sample).
    """

    def __init__(self, dims: int, keypoints: nn.Module, num_groups: int = 8, num_levels: int = 4,
                 num_cams: int = 6, attn_drop: float = 0.15, impl: str = "grid_sample") -> None:
        super().__init__()
        if dims % num_groups:
            raise ValueError(f"embed dims {dims} not divisible by num_groups {num_groups}")
        self.dims, self.num_groups, self.num_levels, self.num_cams = dims, num_groups, num_levels, num_cams
        if impl not in AGGREGATION_IMPLS:
            raise ValueError(f"aggregation={impl!r} is not valid; choose one of: {', '.join(AGGREGATION_IMPLS)}")
        self.attn_drop = attn_drop
        self.impl = impl
        self.kps = keypoints
        self.num_pts = keypoints.num_pts
        self.camera_encoder = linear_relu_ln(dims, 1, 2, 12)
        self.weights_fc = nn.Linear(dims, num_groups * num_levels * self.num_pts)
        self.output_proj = nn.Linear(dims, dims)
        nn.init.zeros_(self.weights_fc.weight)
        nn.init.zeros_(self.weights_fc.bias)
        nn.init.xavier_uniform_(self.output_proj.weight)
        nn.init.zeros_(self.output_proj.bias)

    def forward(self, instance_feature: torch.Tensor, anchor: torch.Tensor, anchor_embed: torch.Tensor,
                feature_maps: list[torch.Tensor], lidar2img: torch.Tensor, image_wh: torch.Tensor) -> torch.Tensor:
        b, q = instance_feature.shape[:2]
        keypoints = self.kps(anchor, instance_feature)  # (B, Q, P, 3)
        weights = self._weights(instance_feature, anchor_embed, lidar2img)  # (B, Q, P, N, L, G)
        points = project_to_images(keypoints, lidar2img, image_wh)  # (B, Q, P, N, 2)
        feats = deformable_aggregation(feature_maps, points, weights, impl=self.impl)
        return torch.cat([self.output_proj(feats), instance_feature], dim=-1)

    def _weights(self, instance_feature: torch.Tensor, anchor_embed: torch.Tensor, lidar2img: torch.Tensor) -> torch.Tensor:
        b, q = instance_feature.shape[:2]
        n, lv, p, g = self.num_cams, self.num_levels, self.num_pts, self.num_groups
        cam_embed = self.camera_encoder(lidar2img[:, :, :3].reshape(b, n, 12).to(instance_feature.dtype))
        feature = (instance_feature + anchor_embed)[:, :, None] + cam_embed[:, None]  # (B, Q, N, C)
        logits = self.weights_fc(feature).view(b, q, n, lv, p, g).permute(0, 1, 4, 2, 3, 5)
        weights = masked_point_softmax(logits, None)
        if self.training and self.attn_drop > 0:
            keep = torch.rand(b, q, p, n, 1, 1, device=weights.device, dtype=weights.dtype) > self.attn_drop
            weights = weights * keep / (1 - self.attn_drop)
        return weights


def project_to_images(points: torch.Tensor, lidar2img: torch.Tensor, image_wh: torch.Tensor) -> torch.Tensor:
    """(B, Q, P, 3) lidar points -> (B, Q, P, N_cam, 2) pixel coordinates normalised by the image size.

    Points behind a camera get a depth clamp (1e-5) as upstream, which throws them far outside the
    image, where bilinear sampling with zero padding returns nothing.
    """
    # pixel coordinates need float32 (bf16 keeps ~3 significant digits): no autocast here
    with torch.autocast(device_type=points.device.type, enabled=False):
        points = points.float()
        rot = lidar2img[:, None, None, :, :3, :3].float()  # (B, 1, 1, N, 3, 3)
        trans = lidar2img[:, None, None, :, :3, 3].float()
        cam = (rot @ points[:, :, :, None, :, None]).squeeze(-1) + trans  # (B, Q, P, N, 3)
        xy = cam[..., :2] / cam[..., 2:3].clamp(min=1e-5)
        return xy / image_wh[:, None, None].float()


class DenseDepthNet(nn.Module):
    """Auxiliary per-pixel depth from the first FPN levels (exp of a 1x1 conv, scaled by focal / 100)."""

    def __init__(self, dims: int, num_layers: int = 3, equal_focal: float = 100.0, max_depth: float = 60.0) -> None:
        super().__init__()
        self.equal_focal, self.max_depth = equal_focal, max_depth
        self.depth_layers = nn.ModuleList([nn.Conv2d(dims, 1, 1) for _ in range(num_layers)])

    def forward(self, feature_maps: list[torch.Tensor], focal: torch.Tensor) -> list[torch.Tensor]:
        """Returns per level (B, N, H_l, W_l) metric depth; ``focal`` is (B, N) (fx in pixels)."""
        out = []
        for conv, feat in zip(self.depth_layers, feature_maps):
            b, n = feat.shape[:2]
            depth = conv(feat.flatten(0, 1).float()).exp().view(b, n, *feat.shape[-2:])
            out.append(depth * (focal.float() / self.equal_focal)[..., None, None])
        return out


def depth_loss(preds: list[torch.Tensor], targets: list[torch.Tensor], max_depth: float = 60.0) -> torch.Tensor:
    """Mean L1 over pixels with a LiDAR return (target > 0), averaged over levels (upstream arithmetic).

    Written with masks and sums instead of boolean indexing so it needs no host sync.
    """
    total = preds[0].new_zeros(())
    n_levels = len(preds)
    for pred, gt in zip(preds, targets):
        gt = gt.to(pred.dtype)
        valid = (gt > 0) & ~torch.isnan(pred)
        err = (pred.nan_to_num(0.0).clamp(0.0, max_depth) - gt).abs() * valid
        total = total + err.sum() / (valid.sum() * n_levels).clamp(min=1)
    return total


class GridMask(nn.Module):
    """GridMask image augmentation (training only), as SparseDrive applies it before the backbone.

    One grid per batch (random period ``d`` and phase), ``mode=1`` keeps the grid lines and zeroes
    the squares. The random numbers come from Python's RNG on the host; the mask is built on the
    images' device, so nothing is synchronised.
    """

    def __init__(self, prob: float = 0.7, ratio: float = 0.5) -> None:
        super().__init__()
        self.prob, self.ratio = prob, ratio

    def forward(self, imgs: torch.Tensor) -> torch.Tensor:
        if not self.training or random.random() > self.prob:
            return imgs
        h, w = imgs.shape[-2:]
        hh, ww = int(1.5 * h), int(1.5 * w)
        d = random.randint(2, h - 1)
        length = min(max(int(d * self.ratio + 0.5), 1), d - 1)
        st_h, st_w = random.randint(0, d - 1), random.randint(0, d - 1)

        def stripes(size: int, start: int) -> torch.Tensor:
            idx = torch.arange(size, device=imgs.device)
            rel = idx - start
            return (rel >= 0) & (rel % d < length) & (rel // d < size // d)

        keep = stripes(hh, st_h)[:, None] | stripes(ww, st_w)[None, :]  # mode 1: the stripes survive
        top, left = (hh - h) // 2, (ww - w) // 2
        mask = keep[top : top + h, left : left + w].to(imgs.dtype)
        return imgs * mask
