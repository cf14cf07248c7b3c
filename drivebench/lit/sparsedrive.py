"""LightningModule for SparseDrive: loss, detection (NDS) / tracking (AMOTA) / map / motion / planning
metrics, backbone learning-rate multiplier, and the streaming state's life cycle.

Streaming state (see ``drivebench.models.sparsedrive.instance_bank``):
- every training epoch starts with an empty state (the streaming sampler restarts its streams);
- validation starts from an empty state and, when it ends, the training streams' state is put
  back, so a validation in the middle of an epoch does not cut the training sequences;
- the state is not in checkpoints: after a resume the first step behaves like a first frame.
Training batches must come from ``drivebench.data.streaming.SequenceGroupedBatchSampler`` (or
carry ``prev_exists`` that is False wherever a slot does not continue its sequence).
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from drivebench.errors import bad_choice
from drivebench.lit.base import DriveModule, OptimizerFactory, SchedulerFactory
from drivebench.lit.param_groups import backbone_and_name_decay_groups
from drivebench.models.common.map_metrics import CHAMFER_THRESHOLDS, ChamferMapAP
from drivebench.models.sparsedrive.decode import decode_detections, decode_map, decode_motion, decode_planning
from drivebench.models.sparsedrive.detection_metric import DetectionMetric
from drivebench.models.sparsedrive.metrics import MotionMetric, PlanningMetric, constant_velocity_plan, metric_notes
from drivebench.models.sparsedrive.model import DETECTION_CLASSES, MAP_CLASSES, SparseDriveOutput
from drivebench.models.sparsedrive.tracking_metric import TrackingMetric

log = logging.getLogger(__name__)
ANCHOR_CHOICES = ("kmeans", "default")


class SparseDriveModule(DriveModule):
    """Train ``drivebench.models.sparsedrive.SparseDrive`` on the camera batch contract.

    Args (beyond ``DriveModule``'s):
        backbone_lr_mult: learning-rate multiplier of the image backbone; None: upstream's, 0.5 in
            stage 1 and 0.1 in stage 2.
        num_detections: detections kept per sample for evaluation (upstream 300).
        plan_rescore: re-rank plans that collide with predicted agents (upstream: on).
        anchors: ``kmeans``: before the first fit or validation, the initial anchors become k-means
            clusters of the training infos (upstream's ``tools/kmeans``; ``models/sparsedrive/kmeans.py``),
            computed once and cached with the data's preprocessing products; anchors given as ``.npy``
            files (``model.net.det_anchors`` ...) stay. ``default``: the built-in data-free anchors.
            A checkpoint restored later brings its own anchors (they are parameters).
        anchor_seed: the k-means seed.

    Weight decay follows upstream (mmcv's default constructor decays every parameter); names
    containing a ``no_weight_decay`` fragment are exempted.
    """

    def __init__(
        self,
        net: nn.Module,
        optimizer: OptimizerFactory,
        scheduler: SchedulerFactory | None = None,
        scheduler_interval: str = "step",
        no_weight_decay: tuple[str, ...] = (),
        backbone_lr_mult: float | None = None,
        num_detections: int = 300,
        plan_rescore: bool = True,
        anchors: str = "kmeans",
        anchor_seed: int = 0,
    ) -> None:
        super().__init__(net, optimizer, scheduler, scheduler_interval, no_weight_decay)
        if anchors not in ANCHOR_CHOICES:
            raise bad_choice("model.module.anchors", anchors, ANCHOR_CHOICES)
        self.anchors, self.anchor_seed = anchors, anchor_seed
        # what set the anchors (for the run summary): None until setup() decided
        self.anchor_report: dict[str, Any] | None = None if anchors == "kmeans" else {"source": "default"}
        stage = getattr(net, "stage", 2)
        self.backbone_lr_mult = backbone_lr_mult if backbone_lr_mult is not None else (0.5 if stage == 1 else 0.1)
        self.num_detections = num_detections
        self.plan_rescore = plan_rescore
        self.det_metric = DetectionMetric(DETECTION_CLASSES)  # mAP, TP errors, NDS
        # AMOTA / AMOTP of the instance bank's track ids (both stages, as upstream evaluates them)
        self.track_metric = TrackingMetric(DETECTION_CLASSES)
        self.map_ap = ChamferMapAP(MAP_CLASSES, CHAMFER_THRESHOLDS)
        self.motion_metric = MotionMetric()
        self.planning_metric = PlanningMetric(forward_yaw=getattr(net, "forward_yaw", math.pi / 2))
        self._train_stream: dict[str, Any] | None = None

    # ---- DriveModule contract ----------------------------------------------------------------
    def compute_loss(self, batch: dict[str, Any], outputs: SparseDriveOutput) -> dict[str, torch.Tensor]:
        return self.net.criterion(batch, outputs)

    def batch_size(self, batch: dict[str, Any]) -> int:
        return int(batch["img"].shape[0])

    def metric_notes(self, values: dict[str, float]) -> dict[str, str]:
        return metric_notes(values)

    def compute_metrics(self) -> dict[str, float]:
        out = {f"det/{k}": v for k, v in self.det_metric.compute().items()}
        out.update({f"track/{k}": v for k, v in self.track_metric.compute().items()})
        if self.net.map_head is not None:
            out.update({f"map/{k}": v for k, v in self.map_ap.compute().items()})
        if self.net.motion_head is not None:
            out.update(self.motion_metric.compute())
            out.update(self.planning_metric.compute())
        return out

    @torch.no_grad()
    def update_metrics(self, batch: dict[str, Any], outputs: SparseDriveOutput) -> None:
        # Validation only (sync points): decoded results and ground truth are copied to the host.
        dets = decode_detections(outputs.det, self.num_detections)
        det_np = {k: getattr(dets, k).cpu().numpy() for k in ("boxes", "scores", "cls_scores", "labels")}
        l2e = batch["lidar2ego"].float().cpu().numpy()
        gt_boxes = [b.float().cpu().numpy() for b in batch["gt_boxes_3d"]]
        gt_labels = [lab.cpu().numpy() for lab in batch["gt_labels_3d"]]
        b = len(gt_boxes)
        gt_attrs = [a.cpu().numpy() for a in batch["gt_attr_labels"]] if "gt_attr_labels" in batch else [None] * b
        gt_vel_ok = ([v.cpu().numpy() for v in batch["gt_velocity_valid"]] if "gt_velocity_valid" in batch
                     else [None] * b)
        for i in range(b):
            self.det_metric.update(det_np["boxes"][i], det_np["scores"][i], det_np["labels"][i], gt_boxes[i],
                                   gt_labels[i], l2e[i], gt_attrs=gt_attrs[i], gt_velocity_valid=gt_vel_ok[i])
        if outputs.det.instance_id is not None and "gt_instance_ids" in batch:
            track_ids = torch.gather(outputs.det.instance_id, 1, dets.query).cpu().numpy()
            scenes = batch["sequence_id"].cpu().numpy()
            times = batch["timestamp"].double().cpu().numpy()
            for i in range(b):
                self.track_metric.update(det_np["boxes"][i], det_np["scores"][i], det_np["cls_scores"][i],
                                         det_np["labels"][i], track_ids[i], gt_boxes[i], gt_labels[i],
                                         batch["gt_instance_ids"][i].cpu().numpy(), int(scenes[i]), float(times[i]),
                                         l2e[i])
        if outputs.map is not None and "gt_map_pts" in batch:
            elements = decode_map(outputs.map)
            pts, scores, labels = (t.cpu().numpy() for t in (elements.points, elements.scores, elements.labels))
            for i in range(b):
                gt = batch["gt_map_pts"][i][:, 0].float().cpu().numpy()
                self.map_ap.update(pts[i], scores[i], labels[i], gt, batch["gt_map_labels"][i].cpu().numpy())
        if outputs.motion is not None:
            trajs, _ = decode_motion(dets, outputs.motion)
            trajs_np = trajs.cpu().numpy()
            plan, _ = decode_planning(outputs.motion, batch["gt_ego_fut_cmd"], dets, rescore=self.plan_rescore,
                                      forward_yaw=self.net.forward_yaw)
            plan_np = plan.cpu().numpy()
            fut = [t.float().cpu().numpy() for t in batch["gt_agent_fut_trajs"]]
            fut_mask = [m.cpu().numpy().astype(bool) for m in batch["gt_agent_fut_masks"]]
            ego_gt = batch["gt_ego_fut_trajs"].float().cpu().numpy()
            ego_mask = batch["gt_ego_fut_masks"].cpu().numpy().astype(bool)
            status = batch["ego_status"].float().cpu().numpy() if "ego_status" in batch else None
            for i in range(b):
                self.motion_metric.update(det_np["boxes"][i], det_np["cls_scores"][i], det_np["labels"][i], trajs_np[i],
                                          gt_boxes[i], gt_labels[i], fut[i], fut_mask[i])
                cv = constant_velocity_plan(status[i], l2e[i], self.planning_metric.steps) if status is not None else None
                self.planning_metric.update(plan_np[i], ego_gt[i], ego_mask[i], gt_boxes[i], fut[i], fut_mask[i], cv)

    # ---- anchors -----------------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        """k-means anchors from the training split of the trainer's datamodule, once (a later fit, e.g.
        the ceiling's, keeps them). Without a nuScenes datamodule the anchors stay as they are."""
        if self.anchor_report is not None:
            return
        datamodule = getattr(self.trainer, "datamodule", None)
        source = getattr(datamodule, "source", None)
        infos = getattr(source, "infos", None)
        if infos is None:
            log.info("SparseDrive anchors: no nuScenes training infos in this trainer's datamodule; the anchors stay")
            return
        t0 = time.perf_counter()
        from drivebench.data.transforms.map_gt import precompute_map_geometry
        from drivebench.locks import exclusive_lock
        from drivebench.models.sparsedrive.kmeans import as_tensors, kmeans_anchors

        records = infos.split(datamodule.train_split)
        workers = datamodule.accel.preprocess_workers
        with exclusive_lock(Path(source.cache_dir) / ".sparsedrive-kmeans.lock"):  # DDP ranks: the first computes
            geometry = precompute_map_geometry(records, source.root, workers=workers, cache_dir=source.cache_dir)
            anchors, report = kmeans_anchors(records, geometry, self.net.anchor_spec(), seed=self.anchor_seed,
                                             cache_dir=source.cache_dir)
        replaced = self.net.set_anchors(as_tensors(anchors))
        self.anchor_report = {"source": "kmeans", "seed": self.anchor_seed, "train_samples": len(records),
                              "replaced": replaced, "from_files": sorted(self.net.anchor_files),
                              "clusters": {k: v for k, v in report.items() if k in replaced},
                              "seconds": time.perf_counter() - t0}  # clustering, or reading the cache
        log.info("SparseDrive anchors: k-means of %d training samples for %s", len(records), ", ".join(replaced))

    def summary_settings(self) -> dict[str, Any]:
        return {"anchors": self.anchor_report or {
            "source": "default", "reason": "no trainer's datamodule held nuScenes training infos (bench=ceiling alone)"}}

    # ---- streaming state ---------------------------------------------------------------------
    def on_train_epoch_start(self) -> None:
        self.net.reset_state()

    def on_validation_epoch_start(self) -> None:
        super().on_validation_epoch_start()
        self._train_stream = self.net.streaming_state()
        self.net.reset_state()

    def on_validation_epoch_end(self) -> None:
        super().on_validation_epoch_end()
        if self._train_stream is not None:
            self.net.load_streaming_state(self._train_stream)
            self._train_stream = None

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.net.reset_state()

    # ---- optimisation ------------------------------------------------------------------------
    def parameter_groups(self) -> list[dict[str, Any]]:
        """Backbone at ``backbone_lr_mult`` x lr; every group decayed unless named in ``no_weight_decay``."""
        return backbone_and_name_decay_groups(self.net.named_parameters(), self.net.encoder.backbone,
                                              self.backbone_lr_mult, self.no_weight_decay)


__all__ = ["SparseDriveModule"]
