"""SparseDrive's motion-planning head: agents and the ego vehicle attend to their own history
(instance queue), to each other and to the map, then predict multi-modal futures and plans.

Written from upstream ``models/motion/*`` (swc-17/SparseDrive). Trajectories are predicted as
per-step displacements (as upstream); ``cumsum`` over steps gives positions relative to the agent
centre (motion) or the ego origin (planning), in the lidar frame.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import nn

from drivebench.models.common.sparse4d import AsymmetricFFN, linear_relu_ln
from drivebench.models.sparsedrive.blocks import ResidualAttention, bias_init_with_prob
from drivebench.models.sparsedrive.boxes import COS_YAW, SIN_YAW, VX, gen_sine_embed_2d, project_box_anchors, rotate_2d
from drivebench.models.sparsedrive.instance_bank import TemporalContext, topk_gather
from drivebench.models.sparsedrive.sparse_head import HeadOutput


@dataclass
class MotionPlanOutput:
    motion_cls: list[torch.Tensor] = field(default_factory=list)  # (B, Q, modes) logits
    motion_reg: list[torch.Tensor] = field(default_factory=list)  # (B, Q, modes, T, 2) per-step displacements
    plan_cls: list[torch.Tensor] = field(default_factory=list)  # (B, 1, 3 * ego_modes) logits
    plan_reg: list[torch.Tensor] = field(default_factory=list)  # (B, 1, 3 * ego_modes, T_ego, 2) displacements
    plan_status: list[torch.Tensor] = field(default_factory=list)  # (B, 1, 10) predicted ego status


@dataclass
class QueueState:
    features: list[torch.Tensor]  # each (B, Q, C), oldest first
    anchors: list[torch.Tensor]  # each (B, Q, 11)
    period: torch.Tensor  # (B, Q) how many queue entries belong to each current instance
    ego_features: list[torch.Tensor]  # each (B, 1, C)
    ego_anchors: list[torch.Tensor]  # each (B, 1, 11)
    ego_period: torch.Tensor  # (B, 1)
    prev_instance_id: torch.Tensor | None = None  # (B, Q)
    prev_confidence: torch.Tensor | None = None  # (B, Q)
    prev_ego_status: torch.Tensor | None = None  # (B, 1, 10)


class InstanceQueue(nn.Module):
    """History of agent and ego instances over the last ``queue_length`` frames, per batch slot.

    Agents are followed through the detection bank's track ids (a previous instance whose
    confidence was above ``tracking_threshold`` and whose id reappears). Same streaming rules as
    the instance bank: plain attributes (not in ``state_dict``, reset on resume), detached, a slot
    with ``valid`` False starts a fresh history, a batch-size change drops everything.

    The ego instance is built from the front camera's coarsest feature map, as upstream.
    """

    def __init__(self, dims: int, queue_length: int = 4, tracking_threshold: float = 0.2,
                 ego_size: tuple[float, float, float] = (1.73, 4.08, 1.56), lidar_height: float = 1.84,
                 forward_yaw: float = math.pi / 2) -> None:
        super().__init__()
        self.queue_length, self.tracking_threshold = queue_length, tracking_threshold
        self.forward = (math.cos(forward_yaw), math.sin(forward_yaw))
        self.ego_feature_encoder = nn.Sequential(
            nn.Conv2d(dims, dims, 3, stride=1, padding=1, bias=False), nn.BatchNorm2d(dims),
            nn.Conv2d(dims, dims, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(dims),
            nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        )
        w, l, h = ego_size
        cos, sin = self.forward
        # ego box: centre 0.5 m ahead of the lidar, on the ground, heading forward (upstream's)
        ego = torch.tensor([[0.5 * cos, 0.5 * sin, -lidar_height + h / 2, math.log(w), math.log(l), math.log(h),
                             sin, cos, 0.0, 0.0, 0.0]])
        self.ego_anchor = nn.Parameter(ego, requires_grad=False)
        self.state: QueueState | None = None

    def reset_state(self) -> None:
        self.state = None

    def get(self, det: HeadOutput, feature_maps: list[torch.Tensor], ctx: TemporalContext) -> tuple[torch.Tensor, ...]:
        """Push the current frame and return (ego feature, ego anchor, queue features, anchors, valid)."""
        assert det.instance_feature is not None
        feature = det.instance_feature.detach()
        anchor = det.prediction[-1].detach()
        b, q = feature.shape[:2]
        state = self.state  # read, never mutated: snapshots (``streaming_state``) stay intact
        if state is None or not ctx.has_history or state.period.shape != (b, q):
            state = None
        else:
            prev_anchors = [project_box_anchors(a, ctx.prev2cur) for a in state.anchors]
            prev_ego_anchors = [project_box_anchors(a, ctx.prev2cur) for a in state.ego_anchors]

        # ---- agents: follow track ids into the current frame
        if state is None:
            features, anchors = [], []
            period = torch.zeros(b, q, dtype=torch.long, device=feature.device)
        else:
            if det.instance_id is None or state.prev_instance_id is None or state.prev_confidence is None:
                raise RuntimeError("the instance queue needs track ids from the detection head (track_ids=True)")
            match = det.instance_id[:, :, None] == state.prev_instance_id[:, None, :]
            match = match & (state.prev_confidence > self.tracking_threshold)[:, None, :]
            found = match.any(dim=-1)  # (B, Q)
            src = match.float().argmax(dim=-1)  # index of the previous instance (ids are unique)

            def follow(x: torch.Tensor) -> torch.Tensor:
                idx = src.view(b, q, *([1] * (x.dim() - 2))).expand(-1, -1, *x.shape[2:])
                gathered = torch.gather(x, 1, idx)
                return gathered * found.view(b, q, *([1] * (x.dim() - 2))).to(x.dtype)

            features = [follow(f) for f in state.features]
            anchors = [follow(a) for a in prev_anchors]
            period = torch.where(found, torch.gather(state.period, 1, src), torch.zeros_like(state.period))
        features.append(feature)
        anchors.append(anchor)
        period = (period + 1).clamp(max=self.queue_length)
        features, anchors = features[-self.queue_length :], anchors[-self.queue_length :]

        # ---- ego: from the front camera's coarsest feature map
        ego_feature = self.ego_feature_encoder(feature_maps[-1][:, 0]).flatten(1)[:, None]  # (B, 1, C)
        ego_anchor = self.ego_anchor[None].expand(b, -1, -1)
        if state is None:
            ego_features, ego_anchors = [], []
            ego_period = torch.zeros(b, 1, dtype=torch.long, device=feature.device)
        else:
            ego_features, ego_anchors = list(state.ego_features), prev_ego_anchors
            ego_period = torch.where(ctx.valid[:, None], state.ego_period, torch.zeros_like(state.ego_period))
            if state.prev_ego_status is not None:
                # the previous step's predicted forward speed (ego_status[6]) as the ego's velocity
                speed = torch.where(ctx.valid[:, None], state.prev_ego_status[..., 6], torch.zeros_like(state.prev_ego_status[..., 6]))
                vel = torch.stack([speed * self.forward[0], speed * self.forward[1]], dim=-1)
                ego_anchor = torch.cat([ego_anchor[..., :VX], vel, ego_anchor[..., VX + 2 :]], dim=-1)
        ego_features = (ego_features + [ego_feature.detach()])[-self.queue_length :]
        ego_anchors = (ego_anchors + [ego_anchor.detach()])[-self.queue_length :]
        ego_period = (ego_period + 1).clamp(max=self.queue_length)

        self.state = QueueState(features, anchors, period, ego_features, ego_anchors, ego_period)
        temp_feature = torch.cat([torch.stack(features, 2), torch.stack(ego_features, 2)], dim=1)  # (B, Q+1, T, C)
        temp_anchor = torch.cat([torch.stack(anchors, 2), torch.stack(ego_anchors, 2)], dim=1)
        all_period = torch.cat([period, ego_period], dim=1)
        age = torch.arange(len(features), 0, -1, device=feature.device)
        temp_valid = age[None, None] <= all_period[..., None]  # (B, Q+1, T)
        return ego_feature, ego_anchor, temp_feature, temp_anchor, temp_valid

    def cache(self, det: HeadOutput, ego_feature: torch.Tensor, ego_status: torch.Tensor) -> None:
        """After the head: remember confidences, track ids, the refined ego feature and ego status
        (on the state object ``get`` created this step)."""
        assert self.state is not None
        self.state.prev_confidence = det.classification[-1].detach().sigmoid().max(dim=-1).values
        self.state.prev_instance_id = det.instance_id
        self.state.prev_ego_status = ego_status.detach()
        self.state.ego_features[-1] = ego_feature.detach()


class MotionPlanRefinement(nn.Module):
    """Mode scores and per-step displacements for agents and the ego, plus the ego status."""

    def __init__(self, dims: int, fut_ts: int, fut_mode: int, ego_fut_ts: int, ego_fut_mode: int, num_cmd: int = 3) -> None:
        super().__init__()
        self.fut_ts, self.fut_mode, self.ego_fut_ts, self.ego_fut_mode, self.num_cmd = fut_ts, fut_mode, ego_fut_ts, ego_fut_mode, num_cmd

        def mlp(out: int) -> nn.Sequential:
            return nn.Sequential(nn.Linear(dims, dims), nn.ReLU(), nn.Linear(dims, dims), nn.ReLU(), nn.Linear(dims, out))

        self.motion_cls_branch = nn.Sequential(*linear_relu_ln(dims, 1, 2), nn.Linear(dims, 1))
        self.motion_reg_branch = mlp(fut_ts * 2)
        self.plan_cls_branch = nn.Sequential(*linear_relu_ln(dims, 1, 2), nn.Linear(dims, 1))
        self.plan_reg_branch = mlp(ego_fut_ts * 2)
        self.plan_status_branch = mlp(10)
        nn.init.constant_(self.motion_cls_branch[-1].bias, bias_init_with_prob(0.01))
        nn.init.constant_(self.plan_cls_branch[-1].bias, bias_init_with_prob(0.01))

    def forward(self, motion_query: torch.Tensor, plan_query: torch.Tensor, ego_feature: torch.Tensor,
                ego_anchor_embed: torch.Tensor) -> tuple[torch.Tensor, ...]:
        b, q = motion_query.shape[:2]
        motion_cls = self.motion_cls_branch(motion_query).squeeze(-1)
        motion_reg = self.motion_reg_branch(motion_query).view(b, q, self.fut_mode, self.fut_ts, 2)
        plan_cls = self.plan_cls_branch(plan_query).squeeze(-1)
        plan_reg = self.plan_reg_branch(plan_query).view(b, 1, self.num_cmd * self.ego_fut_mode, self.ego_fut_ts, 2)
        status = self.plan_status_branch(ego_feature + ego_anchor_embed)
        return motion_cls, motion_reg, plan_cls, plan_reg, status


class MotionPlanningHead(nn.Module):
    """3 x {agent-temporal, agent-agent, agent-map attention, FFN} then one refinement."""

    def __init__(self, dims: int, motion_anchors: torch.Tensor, plan_anchors: torch.Tensor, num_layers: int = 3,
                 num_heads: int = 8, dropout: float = 0.1, queue_length: int = 4, num_det: int = 50, num_map: int = 10,
                 tracking_threshold: float = 0.2, forward_yaw: float = math.pi / 2) -> None:
        super().__init__()
        self.num_det, self.num_map = num_det, num_map
        self.fut_mode, self.fut_ts = motion_anchors.shape[1:3]
        self.num_cmd, self.ego_fut_mode, self.ego_fut_ts = plan_anchors.shape[:3]
        self.queue = InstanceQueue(dims, queue_length, tracking_threshold, forward_yaw=forward_yaw)
        self.temp_attn = nn.ModuleList([ResidualAttention(2 * dims, num_heads, dropout) for _ in range(num_layers)])
        self.agent_attn = nn.ModuleList([ResidualAttention(2 * dims, num_heads, dropout) for _ in range(num_layers)])
        self.map_attn = nn.ModuleList([ResidualAttention(dims, num_heads, dropout) for _ in range(num_layers)])
        self.norms = nn.ModuleList([nn.LayerNorm(dims) for _ in range(3 * num_layers)])
        self.ffn = nn.ModuleList([AsymmetricFFN(dims, dims, 2 * dims, dropout) for _ in range(num_layers)])
        self.refine = MotionPlanRefinement(dims, self.fut_ts, self.fut_mode, self.ego_fut_ts, self.ego_fut_mode, self.num_cmd)
        self.fc_before = nn.Linear(dims, 2 * dims, bias=False)
        self.fc_after = nn.Linear(2 * dims, dims, bias=False)
        self.motion_anchor = nn.Parameter(motion_anchors.float().clone(), requires_grad=False)
        self.plan_anchor = nn.Parameter(plan_anchors.float().clone(), requires_grad=False)
        self.motion_anchor_encoder = nn.Sequential(*linear_relu_ln(dims, 1, 1), nn.Linear(dims, dims))
        self.plan_anchor_encoder = nn.Sequential(*linear_relu_ln(dims, 1, 1), nn.Linear(dims, dims))
        self.dims = dims
        for group in (self.temp_attn, self.agent_attn, self.map_attn, self.ffn, self.norms):
            for p in group.parameters():
                if p.dim() > 1:
                    nn.init.xavier_uniform_(p)

    def reset_state(self) -> None:
        self.queue.reset_state()

    def compile_units(self) -> dict[str, nn.Module]:
        """The dense parts (``model.net.compile_scope=heads``): per layer the three attentions and the FFN,
        the refinement and the two mode-query encoders. Left eager: the instance queue (track-id matching,
        a history that grows for ``queue_length`` steps) and the top-k selections, which are bookkeeping,
        and the ego feature encoder (one small conv stack a step)."""
        units: dict[str, nn.Module] = {"refine": self.refine, "motion_anchor_encoder": self.motion_anchor_encoder,
                                       "plan_anchor_encoder": self.plan_anchor_encoder}
        for i in range(len(self.temp_attn)):
            for kind in ("temp_attn", "agent_attn", "map_attn", "ffn"):
                units[f"{kind}.{i}"] = getattr(self, kind)[i]
        return units

    def attend(self, layer: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               query_pos: torch.Tensor, key_pos: torch.Tensor, key_valid: torch.Tensor | None = None) -> torch.Tensor:
        """Decoupled attention (content and position concatenated to 512-d), as upstream."""
        return self.fc_after(layer(torch.cat([query, query_pos], -1), torch.cat([key, key_pos], -1), self.fc_before(value),
                                   key_valid=key_valid))

    def agent_frame_to_lidar(self, trajs: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
        """Rotate (B, Q, M, T, 2) agent-frame trajectories by each box's yaw."""
        norm = torch.sqrt(boxes[..., SIN_YAW] ** 2 + boxes[..., COS_YAW] ** 2).clamp(min=1e-6)
        cos = (boxes[..., COS_YAW] / norm)[..., None, None]
        sin = (boxes[..., SIN_YAW] / norm)[..., None, None]
        return rotate_2d(trajs, cos, sin)

    def forward(self, det: HeadOutput, map_out: HeadOutput, feature_maps: list[torch.Tensor], ctx: TemporalContext,
                anchor_encoder: nn.Module) -> MotionPlanOutput:
        assert det.instance_feature is not None and det.anchor_embed is not None
        assert map_out.instance_feature is not None and map_out.anchor_embed is not None
        instance_feature, anchor_embed = det.instance_feature, det.anchor_embed
        b, q, c = instance_feature.shape
        det_cls = det.classification[-1].sigmoid()
        det_anchor = det.prediction[-1].detach()
        _, _, (sel_feat, sel_embed) = topk_gather(det_cls.max(-1).values, self.num_det, instance_feature, anchor_embed)
        map_conf = map_out.classification[-1].sigmoid().max(-1).values
        _, _, (map_feat, map_embed) = topk_gather(map_conf, self.num_map, map_out.instance_feature, map_out.anchor_embed)

        ego_feature, ego_anchor, temp_feature, temp_anchor, temp_valid = self.queue.get(det, feature_maps, ctx)
        ego_embed = anchor_encoder(ego_anchor)
        temp_embed = anchor_encoder(temp_anchor).flatten(0, 1)
        temp_feature = temp_feature.flatten(0, 1)
        temp_valid = temp_valid.flatten(0, 1)

        motion_anchor = self.agent_frame_to_lidar(self.motion_anchor[det_cls.argmax(-1)], det_anchor)
        motion_mode_query = self.motion_anchor_encoder(gen_sine_embed_2d(motion_anchor[..., -1, :], self.dims))
        plan_anchor = self.plan_anchor[None].expand(b, -1, -1, -1, -1)
        plan_mode_query = self.plan_anchor_encoder(gen_sine_embed_2d(plan_anchor[..., -1, :], self.dims)).flatten(1, 2)[:, None]

        sel_feat = torch.cat([sel_feat, ego_feature], dim=1)
        sel_embed = torch.cat([sel_embed, ego_embed], dim=1)
        feature = torch.cat([instance_feature, ego_feature], dim=1)
        embed = torch.cat([anchor_embed, ego_embed], dim=1)

        for i in range(len(self.temp_attn)):
            feature = self.attend(self.temp_attn[i], feature.flatten(0, 1)[:, None], temp_feature, temp_feature,
                                  embed.flatten(0, 1)[:, None], temp_embed, temp_valid).view(b, q + 1, c)
            feature = self.attend(self.agent_attn[i], feature, sel_feat, sel_feat, embed, sel_embed)
            feature = self.norms[3 * i](feature)
            feature = self.map_attn[i](feature, map_feat, None, embed, map_embed)
            feature = self.norms[3 * i + 1](feature)
            feature = self.norms[3 * i + 2](self.ffn[i](feature))

        fused = feature + embed
        motion_query = motion_mode_query + fused[:, :q, None]
        plan_query = plan_mode_query + fused[:, q:, None]
        motion_cls, motion_reg, plan_cls, plan_reg, status = self.refine(motion_query, plan_query, feature[:, q:], embed[:, q:])
        self.queue.cache(det, feature[:, q:], status)
        return MotionPlanOutput([motion_cls], [motion_reg], [plan_cls], [plan_reg], [status])
