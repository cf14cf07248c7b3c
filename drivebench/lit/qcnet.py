"""LightningModule of QCNet: upstream's loss, focal-agent metrics vs a constant-velocity baseline,
and upstream's weight-decay split."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from drivebench.lit.base import DriveModule
from drivebench.models.qcnet.loss import QCNetLoss
from drivebench.models.qcnet.metrics import MotionMetrics, constant_velocity_forecast
from drivebench.models.qcnet.static_shapes import ShapeBuckets, StaticShapePadder
from drivebench.models.qcnet.vocab import FOCAL_CATEGORY


def upstream_weight_decay_split(net: nn.Module) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    """(decayed, not decayed) parameters by upstream QCNet's rule.

    Decayed: the matmul weights (``nn.Linear.weight`` and the names a module lists in its
    ``decayed_parameters``, i.e. the Fourier-embedding MLP weights and the GRU weights).
    Not decayed: biases, norms, embeddings, the GRU's initial state and anything else.
    """
    decay_ids: set[int] = set()
    for module in net.modules():
        names = ("weight",) if isinstance(module, nn.Linear) else getattr(module, "decayed_parameters", ())
        for name in names:
            param = getattr(module, name, None)
            if isinstance(param, nn.Parameter):
                decay_ids.add(id(param))
    decay, no_decay = [], []
    for param in net.parameters():
        if param.requires_grad:
            (decay if id(param) in decay_ids else no_decay).append(param)
    return decay, no_decay


class QCNetModule(DriveModule):
    """Train a ``QCNet`` (``drivebench.models.create_model("qcnet", ...)``) on ``collate_qcnet`` batches.

    Validation reports, for the focal agent of each scene (upstream's ``eval_mask``: category 3),
    minADE / minFDE / MR / brier / brier-minFDE of the refined modes at K=6 with softmax(pi), and
    ``cv_minADE`` / ``cv_minFDE`` / ``cv_MR`` of a constant-velocity forecast from the last
    observed velocity, so a run can show the model against a trivial baseline.

    Args:
        net, optimizer, scheduler, scheduler_interval, no_weight_decay: see ``DriveModule``
            (``no_weight_decay`` fragments are excluded from decay on top of upstream's rule).
        criterion: the loss; default upstream's ``QCNetLoss``.
        bucket_growth, max_buckets: the padded shapes used with ``accel.cuda_graphs``
            (:class:`~drivebench.models.qcnet.static_shapes.ShapeBuckets`): more buckets closer to
            the batches pad less (less GPU work per step) and capture more graphs (warm-up, memory).
    """

    def __init__(
        self,
        net: nn.Module,
        optimizer: Any,
        scheduler: Any = None,
        scheduler_interval: str = "epoch",
        no_weight_decay: tuple[str, ...] = (),
        criterion: QCNetLoss | None = None,
        bucket_growth: float = 1.15,
        max_buckets: int = 4,
    ) -> None:
        super().__init__(net, optimizer, scheduler, scheduler_interval, no_weight_decay)
        self.criterion = criterion or QCNetLoss()
        self.model_metrics = MotionMetrics(k=6)
        self.baseline_metrics = MotionMetrics(k=6)
        self.padder: StaticShapePadder | None = None
        self.buckets = ShapeBuckets(growth=bucket_growth, max_buckets=max_buckets)  # validates both
        self.val_padder: StaticShapePadder | None = None  # validation's own buckets (accel.cuda_graphs)

    def compute_loss(self, batch: dict[str, Any], outputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return self.criterion(outputs, batch)

    def update_metrics(self, batch: dict[str, Any], outputs: dict[str, torch.Tensor]) -> None:
        focal = batch["agent_category"] == FOCAL_CATEGORY
        target = batch["agent_target"][..., :2]
        valid = batch["agent_predict_mask"]
        prob = torch.softmax(outputs["pi"].float(), dim=-1)
        self.model_metrics.update(outputs["loc_refine_pos"][..., :2], target, valid, prob, agent_mask=focal)
        baseline = constant_velocity_forecast(batch["agent_velocity"][:, -1].float(),
                                              batch["agent_heading"][:, -1].float(), num_steps=target.size(1))
        self.baseline_metrics.update(baseline.unsqueeze(1), target, valid, None, agent_mask=focal)

    def compute_metrics(self) -> dict[str, float]:
        baseline = self.baseline_metrics.compute()
        metrics = dict(self.model_metrics.compute())
        metrics.update({f"cv_{name}": baseline[name] for name in ("minADE", "minFDE", "MR") if name in baseline})
        return metrics

    def batch_size(self, batch: dict[str, Any]) -> int:
        return int(batch["num_graphs"])

    supports_static_shapes = True
    eager_validation = True  # unpadded validation batches (no CUDA graphs): compiled layers would recompile for each

    def static_batch(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Pad to a shape bucket (``models/qcnet/static_shapes.py``): same loss, few distinct shapes."""
        if self.padder is None:
            self.padder = self._padder(self.buckets)
        return self.padder(batch)

    def _padder(self, buckets: ShapeBuckets) -> StaticShapePadder:
        g = self.net.graph_settings
        return StaticShapePadder(g.num_historical_steps, g.num_modes, buckets)

    def static_val_batch(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Padded like training batches, to buckets of its own: padded agents are never focal, so the metrics
        see the same agents; the training buckets stay those of the training batches."""
        if self.val_padder is None:
            buckets = ShapeBuckets(growth=self.buckets.growth, max_buckets=self.buckets.max_buckets)
            self.val_padder = self._padder(buckets)
        return self.val_padder(batch)

    def static_shapes_report(self) -> dict[str, Any]:
        return {"padding": self.padder.describe()} if self.padder is not None else {}

    def static_val_shapes_report(self) -> dict[str, Any]:
        return {"padding": self.val_padder.describe()} if self.val_padder is not None else {}

    def parameter_groups(self) -> list[dict[str, Any]]:
        """Upstream's split (see :func:`upstream_weight_decay_split`), plus the ``no_weight_decay`` fragments."""
        decay, no_decay = upstream_weight_decay_split(self.net)
        if self.no_weight_decay:
            names = {id(p): n.lower() for n, p in self.net.named_parameters()}
            excluded = {id(p) for p in decay if any(frag in names[id(p)] for frag in self.no_weight_decay)}
            no_decay = no_decay + [p for p in decay if id(p) in excluded]
            decay = [p for p in decay if id(p) not in excluded]
        groups: list[dict[str, Any]] = [{"params": decay}]
        if no_decay:
            groups.append({"params": no_decay, "weight_decay": 0.0})
        return groups
