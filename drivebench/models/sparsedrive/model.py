"""SparseDrive (Sun et al., 2024): sparse end-to-end perception, motion prediction and planning.

``forward(batch)`` reads the keys of ``docs/batch-contract.md`` and returns a ``SparseDriveOutput``;
the loss lives in ``losses.SparseDriveCriterion`` (``model.criterion``) and post-processing in
``decode``. The model is streaming: see ``reset_state`` and ``instance_bank``'s docstring.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

import torch
from torch import nn

from drivebench.models.common.backbone import FPN, MultiViewImageEncoder, ResNetBackbone
from drivebench.models.sparsedrive.anchors import (
    default_detection_anchors,
    default_map_anchors,
    default_motion_anchors,
    default_plan_anchors,
    load_or_default,
)
from drivebench.models.sparsedrive.blocks import DenseDepthNet, GridMask
from drivebench.models.sparsedrive.boxes import lidar_to_global, rigid_inverse
from drivebench.models.sparsedrive.denoising import BoxDenoiser
from drivebench.models.sparsedrive.instance_bank import TemporalContext
from drivebench.models.sparsedrive.motion import MotionPlanningHead, MotionPlanOutput
from drivebench.models.sparsedrive.sparse_head import HeadOutput, build_detection_head, build_map_head

DETECTION_CLASSES = ("car", "truck", "construction_vehicle", "bus", "trailer", "barrier", "motorcycle", "bicycle",
                     "pedestrian", "traffic_cone")
MAP_CLASSES = ("divider", "ped_crossing", "boundary")
COMPILE_SCOPES = ("encoder", "aggregation", "anchors", "heads")


@dataclass
class SparseDriveOutput:
    det: HeadOutput
    map: HeadOutput | None
    motion: MotionPlanOutput | None
    depth: list[torch.Tensor] = field(default_factory=list)  # per level (B, N, H_l, W_l), training only


class SparseDrive(nn.Module):
    """Image encoder + depth aux + detection, map and (stage 2) motion-planning heads.

    Args (sizes in ``__init__.py``): ``stage`` 1 trains detection + map, 2 adds motion and
    planning. ``det_anchors`` / ``map_anchors`` / ``motion_anchors`` / ``plan_anchors``: optional
    ``.npy`` k-means files as upstream's ``data/kmeans``; built-in defaults otherwise, which
    ``set_anchors`` replaces (the LightningModule's k-means of the training infos, ``kmeans.py``).
    ``aggregation``: how the deformable aggregation samples (grid_sample | chunked | compiled | auto).
    ``compile_scope``: what ``accel.compile`` compiles (``encoder`` | ``aggregation`` | ``anchors`` | ``heads``;
    ``compile_units``).
    ``activation_checkpointing``: recompute the ResNet's residual blocks in backward (upstream
    ``with_cp=True``). ``image_size``: the (H, W) the model is fed (metadata for accel's checkpointing).

    Frame: nuScenes' LIDAR_TOP (x right, y forward, z up), as upstream and the data layer, so the
    ego heads along ``forward_yaw`` = pi/2 and ``map_roi`` = (x extent, y extent) = (30, 60) m. A
    lidar frame with x forward takes ``forward_yaw=0, map_roi=(60, 30)``.
    """

    def __init__(
        self,
        stage: int = 2,
        depth: str = "resnet50",
        width_div: int = 1,
        backbone_weights: str | None = None,
        dims: int = 256,
        num_heads: int = 8,
        num_groups: int = 8,
        num_levels: int = 4,
        num_cams: int = 6,
        num_layers: int = 6,
        num_single_frame: int = 1,
        num_det_anchors: int = 900,
        num_det_temp: int = 600,
        num_det_learnable_pts: int = 6,
        num_map_anchors: int = 100,
        num_map_temp: int | None = None,
        num_map_sample: int = 20,
        num_map_learnable_pts: int = 3,
        map_fix_height: tuple[float, ...] = (0, 0.5, -0.5, 1, -1),
        map_roi: tuple[float, float] = (30.0, 60.0),
        forward_yaw: float = math.pi / 2,
        num_motion_layers: int = 3,
        queue_length: int = 4,
        fut_ts: int = 12,
        fut_mode: int = 6,
        ego_fut_ts: int = 6,
        ego_fut_mode: int = 6,
        num_det_for_motion: int = 50,
        num_map_for_motion: int = 10,
        num_depth_layers: int = 3,
        grid_mask: bool = True,
        dropout: float = 0.1,
        confidence_decay: float = 0.6,
        max_time_interval: float = 2.0,
        default_time_interval: float = 0.5,
        det_anchors: str | None = None,
        map_anchors: str | None = None,
        motion_anchors: str | None = None,
        plan_anchors: str | None = None,
        num_dn_groups: int = 0,
        num_det_classes: int = len(DETECTION_CLASSES),
        num_map_classes: int = len(MAP_CLASSES),
        loss: Mapping[str, Any] | None = None,
        aggregation: str = "grid_sample",
        activation_checkpointing: bool = True,
        image_size: tuple[int, int] = (256, 704),
        compile_scope: str = "encoder",
    ) -> None:
        super().__init__()
        if stage not in (1, 2):
            raise ValueError(f"stage={stage!r}; SparseDrive trains in stage 1 (det + map) or 2 (+ motion/planning)")
        if compile_scope not in COMPILE_SCOPES:
            raise ValueError(f"compile_scope={compile_scope!r} is not valid; choose one of: {', '.join(COMPILE_SCOPES)}")
        self.compile_scope = compile_scope
        self.stage = stage
        self.dims, self.num_cams = dims, num_cams
        self.image_size = (int(image_size[0]), int(image_size[1]))  # (H, W) fed to the backbone; metadata only
        self.map_roi = tuple(map_roi)
        self.forward_yaw = float(forward_yaw)
        self.num_map_sample = num_map_sample
        self.max_time_interval, self.default_time_interval = max_time_interval, default_time_interval
        if num_map_temp is None:  # upstream: no temporal map instances in stage 1, 33 in stage 2
            num_map_temp = 0 if stage == 1 else max(num_map_anchors // 3, 1)

        backbone = ResNetBackbone(depth, out_indices=(0, 1, 2, 3), frozen_stages=-1, norm_eval=False,
                                  weights=backbone_weights, width_div=width_div,
                                  activation_checkpointing=activation_checkpointing)
        self.encoder = MultiViewImageEncoder(backbone, FPN(backbone.out_channels, dims, num_outs=num_levels))
        self.grid_mask = GridMask() if grid_mask else None
        self.depth_net = DenseDepthNet(dims, num_depth_layers) if num_depth_layers > 0 else None

        det_anchor_init = load_or_default(det_anchors, default_detection_anchors(num_det_anchors), "detection")
        self.det_head = build_detection_head(
            det_anchor_init, dims, num_det_classes, num_det_temp, num_layers, num_single_frame, num_heads, num_groups,
            num_levels, num_cams, num_det_learnable_pts, confidence_decay, track_ids=True, dropout=dropout,
            aggregation=aggregation)
        map_anchor_init = load_or_default(map_anchors, default_map_anchors(num_map_anchors, num_map_sample, self.map_roi, forward_yaw=self.forward_yaw), "map")
        self.map_head = build_map_head(
            map_anchor_init, dims, num_map_classes, num_map_temp, num_layers, num_single_frame, num_heads, num_groups,
            num_levels, num_cams, num_map_sample, num_map_learnable_pts, tuple(map_fix_height),
            confidence_decay=confidence_decay, dropout=dropout, aggregation=aggregation)
        self.denoiser = BoxDenoiser(num_dn_groups, num_det_classes) if num_dn_groups > 0 else None
        self.motion_head: MotionPlanningHead | None = None
        if stage == 2:
            motion_init = load_or_default(motion_anchors, default_motion_anchors(num_det_classes, fut_mode, fut_ts), "motion")
            plan_init = load_or_default(plan_anchors, default_plan_anchors(ego_fut_mode, ego_fut_ts, forward_yaw=self.forward_yaw), "plan")
            self.motion_head = MotionPlanningHead(
                dims, motion_init, plan_init, num_motion_layers, num_heads, dropout, queue_length,
                min(num_det_for_motion, num_det_anchors), min(num_map_for_motion, num_map_anchors),
                forward_yaw=self.forward_yaw)

        from drivebench.models.sparsedrive.losses import SparseDriveCriterion  # the criterion reads head sizes

        self.criterion = SparseDriveCriterion(self, **dict(loss or {}))
        # anchors given as .npy files; the others are the built-in defaults until set_anchors replaces them
        self.anchor_files = {name: path for name, path in (("det", det_anchors), ("map", map_anchors),
                                                           ("motion", motion_anchors), ("plan", plan_anchors))
                             if path is not None}
        self.class_names = DETECTION_CLASSES[:num_det_classes]
        self._prev_lidar2global: torch.Tensor | None = None
        self._prev_timestamp: torch.Tensor | None = None

    # ---- anchors -----------------------------------------------------------------------------
    def anchor_parameters(self) -> dict[str, nn.Parameter]:
        """The initial anchors by kind: det (N, 11), map (M, 2 * samples), motion and plan (stage 2)."""
        out = {"det": self.det_head.bank.anchor, "map": self.map_head.bank.anchor}
        if self.motion_head is not None:
            out.update(motion=self.motion_head.motion_anchor, plan=self.motion_head.plan_anchor)
        return out

    def anchor_spec(self) -> Any:
        """What k-means anchors for this network must look like (``kmeans.AnchorSpec``)."""
        from drivebench.models.sparsedrive.kmeans import AnchorSpec

        params = self.anchor_parameters()
        motion, plan = params.get("motion"), params.get("plan")
        return AnchorSpec(num_det=params["det"].shape[0], num_map=params["map"].shape[0],
                          num_map_sample=self.num_map_sample, class_names=tuple(self.class_names),
                          motion=tuple(motion.shape[:3]) if motion is not None else None,
                          plan=tuple(plan.shape[:3]) if plan is not None else None,
                          forward_yaw=self.forward_yaw, map_roi=self.map_roi)

    @torch.no_grad()
    def set_anchors(self, anchors: Mapping[str, torch.Tensor]) -> list[str]:
        """Copy new initial anchors in (kinds loaded from ``.npy`` files keep theirs); the kinds set."""
        params = self.anchor_parameters()
        done = []
        for name, value in anchors.items():
            if name in self.anchor_files or name not in params:
                continue
            param = params[name]
            value = value.reshape(param.shape) if value.numel() == param.numel() else value
            if value.shape != param.shape:
                raise ValueError(f"{name} anchors have shape {tuple(value.shape)}; this network needs {tuple(param.shape)}")
            param.copy_(value.to(param))
            done.append(name)
        return done

    # ---- streaming state ---------------------------------------------------------------------
    def reset_state(self) -> None:
        """Forget every temporal cache (instance banks, instance queue, previous pose)."""
        self.det_head.reset_state()
        self.map_head.reset_state()
        if self.motion_head is not None:
            self.motion_head.reset_state()
        self._prev_lidar2global = None
        self._prev_timestamp = None

    def streaming_state(self) -> dict[str, Any]:
        """A snapshot of the streaming state (references; the model replaces rather than mutates it)."""
        snap: dict[str, Any] = {"pose": self._prev_lidar2global, "time": self._prev_timestamp,
                                "det": (self.det_head.bank.state, self.det_head.bank.next_id),
                                "map": (self.map_head.bank.state, self.map_head.bank.next_id)}
        if self.motion_head is not None:
            snap["queue"] = self.motion_head.queue.state
        return snap

    def load_streaming_state(self, snap: Mapping[str, Any]) -> None:
        """Restore a ``streaming_state()`` snapshot (e.g. the training streams after validation)."""
        self._prev_lidar2global, self._prev_timestamp = snap["pose"], snap["time"]
        self.det_head.bank.state, self.det_head.bank.next_id = snap["det"]
        self.map_head.bank.state, self.map_head.bank.next_id = snap["map"]
        if self.motion_head is not None:
            self.motion_head.queue.state = snap.get("queue")

    def temporal_context(self, batch: Mapping[str, Any]) -> TemporalContext:
        """Relate this batch to the previous one per slot, then remember this batch's pose/time."""
        for key in ("prev_exists", "lidar2ego", "ego2global", "timestamp"):
            if key not in batch:
                raise KeyError(f"SparseDrive needs batch[{key!r}] (docs/batch-contract.md) for its streaming state")
        lidar2global = lidar_to_global(batch["lidar2ego"], batch["ego2global"])
        timestamp = batch["timestamp"].double()
        b = timestamp.shape[0]
        device = batch["lidar2ego"].device
        prev = self._prev_lidar2global
        has_history = prev is not None and prev.shape[0] == b and self._prev_timestamp is not None
        if has_history:
            assert prev is not None and self._prev_timestamp is not None
            prev2cur = (rigid_inverse(lidar2global) @ prev).float()
            dt = (timestamp - self._prev_timestamp).float()
            valid = batch["prev_exists"].to(device=device, dtype=torch.bool) & (dt.abs() <= self.max_time_interval)
        else:
            prev2cur = torch.eye(4, device=device).expand(b, 4, 4)
            dt = torch.zeros(b, device=device)
            valid = torch.zeros(b, dtype=torch.bool, device=device)
        interval = torch.where(valid & (dt != 0), dt, torch.full_like(dt, self.default_time_interval))
        self._prev_lidar2global = lidar2global.detach()
        self._prev_timestamp = timestamp.detach()
        return TemporalContext(has_history, valid, prev2cur, dt, interval)

    def backbone_input_shape(self, batch_size: int) -> tuple[int, int, int, int]:
        """What the backbone sees per step: every camera image of the batch (sizes the checkpointing choice)."""
        return (batch_size * self.num_cams, 3, *self.image_size)

    @property
    def compiled_shapes_vary_with_data(self) -> bool:
        """Whether a compiled unit's shapes depend on the batch (``accel.compile_shape_profile=auto`` keeps
        Dynamo's shape profile only then): the denoising queries number with each batch's boxes; without them
        the images, anchors and queries are the same every step."""
        return self.denoiser is not None

    # ---- forward -----------------------------------------------------------------------------
    def compile_units(self) -> dict[str, nn.Module]:
        """What ``accel.compile`` compiles, by ``compile_scope`` (docs/accel.md):

        ``encoder``: the image backbone + FPN (static shapes, most FLOPs); the heads run eagerly.
        ``aggregation`` (the config's default): also each detection and map layer's deformable aggregation
        (``det_head.dfa.0``), so that with ``aggregation=auto`` the corner gathers run compiled where the model
        compiles (``max`` on GPUs) and ``grid_sample`` where it does not. Why: under bf16 ``grid_sample`` keeps
        a float32 copy of each sampled level; on an H100 the compiled aggregation stepped 0.576 s against
        0.648 s, 19.6 against 36.6 GiB (b59).
        ``anchors``: also the detection and map heads' anchor encoders (``det_head.anchor_encoder``): the largest
        eager part left under ``aggregation`` (the detection encoder, four small MLPs called seven times a
        forward, dispatches 1,050 of a validation forward's 6,100 operators at ``small``); a training and a
        validation graph more per head, so a measured choice.
        ``heads``: every head's dense parts (``*.compile_units``: anchor encoders, attention, aggregation, FFN,
        refinement), a unit per module; the data-dependent bookkeeping (instance bank, queue, denoising
        queries, matching) stays eager, so no unit breaks its graph. A varying query count (denoising, off in
        ``small``) recompiles a unit once with that dimension dynamic (``compile_dynamic`` null), not once a
        step; the attention's ~9 structural variants pass Dynamo's default limit of 8, which ``apply_compile``
        raises. Its cold compile ran past 186 s on an H100 without finishing a step (b59): not a default.
        """
        units: dict[str, nn.Module] = {"encoder": self.encoder}
        if self.compile_scope == "encoder":
            return units
        heads = {"det_head": self.det_head, "map_head": self.map_head}
        if self.compile_scope == "heads":
            heads["motion_head"] = self.motion_head
        for prefix, head in heads.items():
            if head is None:
                continue
            for name, module in head.compile_units().items():
                if (self.compile_scope == "heads" or name.startswith("dfa.")
                        or (self.compile_scope == "anchors" and name == "anchor_encoder")):
                    units[f"{prefix}.{name}"] = module
        return units

    def forward(self, batch: Mapping[str, Any]) -> SparseDriveOutput:
        img = batch["img"]
        if img.dim() != 5 or img.shape[1] != self.num_cams:
            raise ValueError(f"batch['img'] has shape {tuple(img.shape)}; SparseDrive expects (B, {self.num_cams}, 3, H, W)")
        b, n, _, h, w = img.shape
        if self.grid_mask is not None:
            img = self.grid_mask(img.flatten(0, 1)).view_as(img)
        feature_maps = self.encoder(img)
        lidar2img = batch["lidar2img"].float()
        # features cover the padded image, so keypoints are normalised by the tensor size
        image_wh = img.new_full((b, n, 2), float(w))
        image_wh[..., 1] = float(h)
        ctx = self.temporal_context(batch)

        depth: list[torch.Tensor] = []
        if self.training and self.depth_net is not None and "gt_depth" in batch:
            depth = self.depth_net(feature_maps, batch["cam_intrinsic"][..., 0, 0])

        dn = None
        if self.training and self.denoiser is not None and "gt_boxes_3d" in batch:
            dn = self.denoiser(list(batch["gt_labels_3d"]), list(batch["gt_boxes_3d"]), img.device)
        det = self.det_head(feature_maps, lidar2img, image_wh, ctx, dn)
        map_out = self.map_head(feature_maps, lidar2img, image_wh, ctx)
        motion = None
        if self.motion_head is not None:
            motion = self.motion_head(det, map_out, feature_maps, ctx, self.det_head.anchor_encoder)
        return SparseDriveOutput(det, map_out, motion, depth)
