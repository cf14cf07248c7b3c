"""Post-processing of SparseDrive outputs into boxes, map elements, trajectories and plans.

Mirrors upstream's decoders (``SparseBox3DDecoder``, ``SparsePoint3DDecoder``,
``SparseBox3DMotionDecoder``, ``HierarchicalPlanningDecoder``). Everything stays on the device;
metrics copy the results to the host once per batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from drivebench.models.sparsedrive.boxes import CNS, YAW, boxes_overlap_bev, decode_boxes
from drivebench.models.sparsedrive.motion import MotionPlanOutput
from drivebench.models.sparsedrive.sparse_head import HeadOutput


@dataclass
class Detections:
    boxes: torch.Tensor  # (B, K, 9)
    scores: torch.Tensor  # (B, K) class score x centerness (ranking score)
    cls_scores: torch.Tensor  # (B, K) class score alone
    labels: torch.Tensor  # (B, K)
    query: torch.Tensor  # (B, K) index of the query each detection came from


def decode_detections(det: HeadOutput, num_output: int = 300) -> Detections:
    """One detection per query (its best class), top ``num_output`` by score, re-ranked by
    centerness as upstream (``squeeze_cls`` mode, used when track ids exist)."""
    cls = det.classification[-1].float().sigmoid()
    scores, labels = cls.max(dim=-1)
    k = min(num_output, scores.shape[1])
    scores, query = scores.topk(k, dim=1)
    labels = torch.gather(labels, 1, query)
    cls_scores = scores
    quality = det.quality[-1]
    if quality is not None:
        cns = torch.gather(quality[..., CNS].float(), 1, query).sigmoid()
        scores, order = (scores * cns).sort(dim=1, descending=True)
        query, labels, cls_scores = (torch.gather(t, 1, order) for t in (query, labels, cls_scores))
    state = torch.gather(det.prediction[-1].float(), 1, query[..., None].expand(-1, -1, det.prediction[-1].shape[-1]))
    return Detections(decode_boxes(state), scores, cls_scores, labels, query)


@dataclass
class MapElements:
    points: torch.Tensor  # (B, K, S, 2)
    scores: torch.Tensor  # (B, K)
    labels: torch.Tensor  # (B, K)


def decode_map(map_out: HeadOutput, num_output: int | None = None) -> MapElements:
    """Top-k over (query, class) pairs, as upstream (a query may appear with several classes)."""
    cls = map_out.classification[-1].float().sigmoid()
    b, q, c = cls.shape
    k = min(num_output or q, q * c)
    scores, flat = cls.flatten(1).topk(k, dim=1)
    query, labels = flat // c, flat % c
    pts = map_out.prediction[-1].float().view(b, q, -1, 2)
    points = torch.gather(pts, 1, query[..., None, None].expand(-1, -1, pts.shape[2], 2))
    return MapElements(points, scores, labels)


def decode_motion(dets: Detections, motion: MotionPlanOutput) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, K, modes, T, 2) absolute future positions (lidar frame) and (B, K, modes) mode probabilities."""
    reg = motion.motion_reg[-1].float()
    b, q, m, t, _ = reg.shape
    idx = dets.query
    trajs = torch.gather(reg, 1, idx[..., None, None, None].expand(-1, -1, m, t, 2)).cumsum(dim=-2)
    trajs = trajs + dets.boxes[:, :, None, None, :2]
    probs = torch.gather(motion.motion_cls[-1].float().sigmoid(), 1, idx[..., None].expand(-1, -1, m))
    return trajs, probs


def trajectory_yaw(traj: torch.Tensor, start_yaw: torch.Tensor, static_dist: float = 0.5) -> torch.Tensor:
    """Heading along (..., T, 2) trajectories starting at the origin of the path (first point is
    the start): central differences, the last step a backward difference; near-static paths keep
    ``start_yaw`` (broadcast to (...))."""
    t = traj.shape[-2]
    yaw = torch.zeros(traj.shape[:-1], dtype=traj.dtype, device=traj.device)
    if t >= 3:
        d = traj[..., 2:, :] - traj[..., :-2, :]
        yaw[..., 1:-1] = torch.atan2(d[..., 1], d[..., 0])
    if t >= 2:
        d = traj[..., -1, :] - traj[..., -2, :]
        yaw[..., -1] = torch.atan2(d[..., 1], d[..., 0])
    yaw[..., 0] = start_yaw
    static = torch.linalg.norm(traj[..., -1, :] - traj[..., 0, :], dim=-1) < static_dist
    return torch.where(static[..., None], start_yaw[..., None].expand_as(yaw), yaw)


def ego_boxes(plan: torch.Tensor, size: tuple[float, float, float] = (1.85, 4.084, 1.56), offset: float = 0.5,
              forward_yaw: float = math.pi / 2) -> torch.Tensor:
    """(..., T, 2) ego plans (positions of the lidar origin) -> (..., T, 7) ego boxes (w, l, h),
    moved ``offset`` m forward along the heading (UniAD / SparseDrive convention). A plan that
    barely moves keeps the ego's current heading ``forward_yaw`` (in the lidar frame)."""
    with_origin = torch.cat([torch.zeros_like(plan[..., :1, :]), plan], dim=-2)
    start = torch.full(plan.shape[:-2], forward_yaw, dtype=plan.dtype, device=plan.device)
    yaw = trajectory_yaw(with_origin, start)[..., 1:]
    centre = plan + offset * torch.stack([torch.cos(yaw), torch.sin(yaw)], dim=-1)
    dims = torch.stack([torch.full_like(yaw, s) for s in size], dim=-1)
    return torch.cat([centre, torch.zeros_like(yaw)[..., None], dims, yaw[..., None]], dim=-1)


def decode_planning(motion: MotionPlanOutput, command: torch.Tensor, dets: Detections | None = None,
                    rescore: bool = True, score_threshold: float = 0.5,
                    forward_yaw: float = math.pi / 2) -> tuple[torch.Tensor, torch.Tensor]:
    """The final plan (B, T, 2) and the scores (B, modes) of the commanded mode set.

    With ``rescore`` (upstream default), modes whose ego box would overlap a confident agent's
    most likely future box at the same step are pushed down, unless every mode collides.
    """
    cls, reg = motion.plan_cls[-1].float(), motion.plan_reg[-1].float()
    b, _, n, t, _ = reg.shape
    num_cmd = command.shape[-1]
    modes = n // num_cmd
    rows = torch.arange(b, device=reg.device)
    cmd = command.argmax(dim=-1)
    scores = cls.view(b, num_cmd, modes)[rows, cmd]
    plans = reg.view(b, num_cmd, modes, t, 2)[rows, cmd].cumsum(dim=-2)
    if rescore and dets is not None:
        trajs, probs = decode_motion(dets, motion)
        best = probs.argmax(dim=-1)
        agent_traj = torch.gather(trajs, 2, best[..., None, None, None].expand(-1, -1, 1, trajs.shape[3], 2)).squeeze(2)[..., :t, :]
        start = dets.boxes[..., None, :2]
        agent_yaw = trajectory_yaw(torch.cat([start, agent_traj], dim=-2), dets.boxes[..., YAW])[..., 1:]
        agent = torch.cat([agent_traj, dets.boxes[..., None, 2:6].expand(-1, -1, t, 4), agent_yaw[..., None]], dim=-1)
        ego = ego_boxes(plans, size=(1.73 * 1.1, 4.08 * 1.1, 1.56 * 1.1), forward_yaw=forward_yaw)  # (B, M, T, 7)
        hits = boxes_overlap_bev(ego[:, :, None], agent[:, None])  # (B, M, K, T)
        hits = hits & (dets.cls_scores >= score_threshold)[:, None, :, None]
        collide = hits.flatten(2).any(dim=-1)  # (B, M)
        collide = collide & ~collide.all(dim=-1, keepdim=True)
        scores = scores - 999.0 * collide.float()
    best_mode = scores.argmax(dim=-1)
    return plans[rows, best_mode], scores
