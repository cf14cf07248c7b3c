"""LightningModule for MapTR: loss, chamfer-AP validation, backbone learning-rate multiplier."""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from drivebench.lit.base import DriveModule, OptimizerFactory, SchedulerFactory
from drivebench.lit.param_groups import backbone_and_name_decay_groups
from drivebench.models.common.map_metrics import CHAMFER_THRESHOLDS, MAP_CLASSES, ChamferMapAP
from drivebench.models.maptr.criterion import MapTRCriterion
from drivebench.models.maptr.postprocess import decode_top_k


class MapTRModule(DriveModule):
    """Train ``drivebench.models.maptr.MapTR`` on the map keys of the camera batch contract.

    Args (beyond ``DriveModule``'s):
        backbone_lr_mult: learning-rate multiplier of the image backbone (0.1 upstream).
        max_predictions: elements kept per sample for evaluation (upstream ``max_num`` = 50).
        loss_weights: optional overrides of ``MapTRCriterion`` keywords (weights, focal parameters).

    Weight decay: upstream (mmcv's default optimizer constructor) decays every parameter, norms and
    embeddings included; only names containing a ``no_weight_decay`` fragment are exempted here.
    """

    def __init__(
        self,
        net: nn.Module,
        optimizer: OptimizerFactory,
        scheduler: SchedulerFactory | None = None,
        scheduler_interval: str = "step",
        no_weight_decay: tuple[str, ...] = (),
        backbone_lr_mult: float = 0.1,
        max_predictions: int = 50,
        loss_weights: dict[str, float] | None = None,
    ) -> None:
        super().__init__(net, optimizer, scheduler, scheduler_interval, no_weight_decay)
        self.backbone_lr_mult = backbone_lr_mult
        self.max_predictions = max_predictions
        self.criterion = MapTRCriterion(net.pc_range, net.num_classes, **(loss_weights or {}))
        self.chamfer_ap = ChamferMapAP(MAP_CLASSES[: net.num_classes], CHAMFER_THRESHOLDS)

    # ---- DriveModule contract ----------------------------------------------------------------
    def compute_loss(self, batch: dict[str, Any], outputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return self.criterion(outputs, batch["gt_map_labels"], batch["gt_map_pts"], batch.get("gt_map_num_orderings"))

    def update_metrics(self, batch: dict[str, Any], outputs: dict[str, torch.Tensor]) -> None:
        decoded = decode_top_k(outputs["cls_logits"][-1], outputs["pts"][-1], self.max_predictions)
        # Validation only (sync points): one device -> host copy for the decoded predictions, one
        # for the ground truth (ordering 0 of each element, its points as given).
        packed = torch.cat([decoded["scores"][..., None].float(), decoded["labels"][..., None].float(),
                            decoded["pts"].flatten(2).float()], dim=-1).detach().cpu().numpy()
        sizes = [int(lbl.shape[0]) for lbl in batch["gt_map_labels"]]
        gt_packed = torch.cat([
            torch.cat([p[:, 0].flatten(1).float() for p in batch["gt_map_pts"]]),
            torch.cat(list(batch["gt_map_labels"]))[:, None].float(),
        ], dim=1).detach().cpu().numpy()
        n_pts = decoded["pts"].shape[2]
        start = 0
        for i, size in enumerate(sizes):
            gt = gt_packed[start:start + size]
            start += size
            self.chamfer_ap.update(packed[i, :, 2:].reshape(-1, n_pts, 2), packed[i, :, 0],
                                       packed[i, :, 1].astype(int), gt[:, :-1].reshape(size, -1, 2),
                                       gt[:, -1].astype(int))

    def compute_metrics(self) -> dict[str, float]:
        return self.chamfer_ap.compute()

    def batch_size(self, batch: dict[str, Any]) -> int:
        return int(batch["img"].shape[0])

    # ---- optimisation ------------------------------------------------------------------------
    def parameter_groups(self) -> list[dict[str, Any]]:
        """Backbone at ``backbone_lr_mult`` x lr; every group decayed unless named in ``no_weight_decay``."""
        return backbone_and_name_decay_groups(self.net.named_parameters(), self.net.image_encoder.backbone,
                                              self.backbone_lr_mult, self.no_weight_decay)
