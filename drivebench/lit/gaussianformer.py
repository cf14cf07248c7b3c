"""LightningModule of GaussianFormer: occupancy loss, mIoU/IoU accumulation, backbone lr x0.1."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from drivebench.lit.base import DriveModule
from drivebench.lit.param_groups import split_off_backbone
from drivebench.models.gaussianformer.losses import OccupancyLoss
from drivebench.models.gaussianformer.metrics import OccupancyMetric, metric_notes


class GaussianFormerModule(DriveModule):
    """Train a ``GaussianFormer`` net (``drivebench.models.create_model("gaussianformer", ...)``).

    Args:
        net, optimizer, scheduler, scheduler_interval, no_weight_decay: see ``DriveModule``.
        criterion: the occupancy loss; default upstream's (CE x10 with manual class weights + Lovasz x1).
        backbone_lr_mult: learning-rate multiplier of the image backbone (upstream ``img_backbone``: 0.1;
            the FPN keeps the base rate).
    """

    def __init__(
        self,
        net: nn.Module,
        optimizer: Any,
        scheduler: Any = None,
        scheduler_interval: str = "step",
        no_weight_decay: tuple[str, ...] = (),
        criterion: OccupancyLoss | None = None,
        backbone_lr_mult: float = 0.1,
    ) -> None:
        super().__init__(net, optimizer, scheduler, scheduler_interval, no_weight_decay)
        self.criterion = criterion or OccupancyLoss(num_classes=net.num_classes, lovasz_ignore=net.empty_label)
        self.metric = OccupancyMetric(num_classes=net.num_classes, empty_label=net.empty_label)
        self.backbone_lr_mult = backbone_lr_mult

    def compute_loss(self, batch: dict[str, Any], outputs: dict[str, Any]) -> dict[str, torch.Tensor]:
        return self.criterion(outputs["occ_logits"], batch["occ_label"], batch.get("occ_mask"))

    def update_metrics(self, batch: dict[str, Any], outputs: dict[str, Any]) -> None:
        self.metric.update(outputs["occ_pred"], batch["occ_label"], batch.get("occ_mask"))

    def compute_metrics(self) -> dict[str, float]:
        return self.metric.compute()

    def batch_size(self, batch: dict[str, Any]) -> int:
        return int(batch["img"].shape[0])

    def metric_notes(self, values: dict[str, float]) -> dict[str, str]:
        return metric_notes(values, len(self.metric.semantic_classes))

    def parameter_groups(self) -> list[dict[str, Any]]:
        """Decay / no-decay groups as ``DriveModule``, split again into the rest and the backbone (lr x mult)."""
        return split_off_backbone(super().parameter_groups(), self.net.image_encoder.backbone, self.backbone_lr_mult)
