"""The shared LightningModule: a pure-PyTorch net, its loss and metrics, an optimizer from config.

Subclasses (one per model, in ``drivebench.lit.<model>``) implement four small methods:
``compute_loss``, ``update_metrics``, ``compute_metrics`` and ``batch_size``; their validation
metrics are torchmetrics ``Metric`` attributes, so Lightning moves them with the module and
torchmetrics gathers their states over DDP ranks in ``compute``.
Everything else (logging keys, optimizer/scheduler wiring) lives here once. The module holds the
model, its loss, metrics and optimisation only: the copy to the device and the device transform
are the datamodule's (``drivebench.data.device_transfer``), the timing is the step timer's.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Any, Callable, Iterable

import lightning.pytorch as pl
import torch
from torch import nn

from torchmetrics import Metric

from drivebench.accel.cuda_graphs import GraphedForward, GraphedLoss

CONFIG_KEY = "drivebench_config"  # the checkpoint entry holding the run's resolved, redacted config
OptimizerFactory = Callable[[Iterable[Any]], torch.optim.Optimizer]
SchedulerFactory = Callable[[torch.optim.Optimizer], Any]


class DriveModule(pl.LightningModule):
    """Train ``net`` with the loss its subclass defines.

    Args:
        net: the model (``drivebench.models.create_model(...)``).
        optimizer: a partial optimizer (Hydra ``_partial_: true``) taking parameter groups.
        scheduler: optional partial LR scheduler taking the optimizer.
        scheduler_interval: ``step`` or ``epoch``.
        no_weight_decay: parameter-name fragments excluded from weight decay (norms, biases,
            embeddings, as upstream recipes do).
    """

    def __init__(
        self,
        net: nn.Module,
        optimizer: OptimizerFactory,
        scheduler: SchedulerFactory | None = None,
        scheduler_interval: str = "step",
        no_weight_decay: tuple[str, ...] = (),
    ) -> None:
        super().__init__()
        if scheduler_interval not in ("step", "epoch"):
            raise ValueError(f"scheduler_interval must be 'step' or 'epoch', got {scheduler_interval!r}")
        self.net = net
        self.optimizer_factory = optimizer
        self.scheduler_factory = scheduler
        self.scheduler_interval = scheduler_interval
        self.no_weight_decay = tuple(no_weight_decay)
        # the run's resolved config (credentials redacted), written into every checkpoint so that a
        # checkpoint says what produced it; set by drivebench.app.build_run
        self.run_config: dict[str, Any] | None = None
        self.graphed_loss: GraphedLoss | None = None  # accel.cuda_graphs: set by enable_cuda_graphs
        self.graphed_eval: GraphedForward | None = None  # the same, for validation inside a fit
        self.fused_optimizer = False  # accel.fused_optimizer: set by drivebench.app.build_run

    # ---- subclass contract -------------------------------------------------------------------
    def compute_loss(self, batch: Any, outputs: Any) -> dict[str, torch.Tensor]:
        """Return named loss terms; the key ``loss`` is the one that is backpropagated."""
        raise NotImplementedError

    def update_metrics(self, batch: Any, outputs: Any) -> None:
        """Accumulate validation metrics for one batch."""

    def compute_metrics(self) -> dict[str, float]:
        """Return the validation metrics accumulated since the last reset (from the metrics'
        ``compute()``: under DDP, of every rank's samples)."""
        return {}

    def reset_metrics(self) -> None:
        """Clear every validation metric (each torchmetrics ``Metric`` attribute of the module)."""
        for module in self.modules():
            if isinstance(module, Metric):
                module.reset()

    def batch_size(self, batch: Any) -> int:
        """Number of samples (scenes) in ``batch``."""
        raise NotImplementedError

    supports_static_shapes = False  # True where ``static_batch`` pads batches to a few fixed shapes

    def static_batch(self, batch: Any) -> Any:
        """``batch`` padded to one of a few fixed shapes with an unchanged loss (``accel.cuda_graphs``)."""
        raise NotImplementedError(f"{type(self).__name__} does not pad its batches to static shapes")

    def static_val_batch(self, batch: Any) -> Any:
        """A validation batch padded to one of a few fixed shapes with unchanged outputs for its real rows and
        unchanged metrics; its own shapes, so validation never changes the padding of training batches."""
        raise NotImplementedError(f"{type(self).__name__} does not pad its batches to static shapes")

    # ---- accel.cuda_graphs -------------------------------------------------------------------
    def enable_cuda_graphs(self) -> None:
        """Replay the training forward + loss (and its backward) from CUDA graphs, one per padded shape, and
        the validation forward + loss of each fit likewise."""
        self.graphed_loss = GraphedLoss(self, self.loss_of_batch)
        self.graphed_eval = GraphedForward(self._eval_outputs)

    def disable_cuda_graphs(self) -> None:
        self.graphed_loss = None
        self.graphed_eval = None

    def release_cuda_graphs(self) -> None:
        """Drop the captured graphs (both kinds); each shape captures anew at its next call."""
        for graphed in (self.graphed_loss, self.graphed_eval):
            if graphed is not None:
                graphed.release()

    def on_fit_start(self) -> None:
        # each fit captures its own graphs: Lightning's teardown of a fit frees the cuBLAS workspaces
        # (``_clear_cuda_memory``) that kernels captured during it point to, so replaying them in the
        # next fit (the ceiling after training) read freed memory (seen on the H200: an illegal memory
        # access at the ceiling's first step)
        self.release_cuda_graphs()

    def cuda_graphs_report(self) -> dict[str, Any]:
        """Graphs captured, their capture times and replays, plus the model's padding (summary settings);
        ``validation``: the same for validation inside the fits."""
        report = self.graphed_loss.describe() if self.graphed_loss is not None else {}
        report = {**report, **self.static_shapes_report()}
        if self.graphed_eval is not None and self.graphed_eval.replays:
            report["validation"] = {**self.graphed_eval.describe(), **self.static_val_shapes_report()}
        return report

    def static_shapes_report(self) -> dict[str, Any]:
        return {}

    def static_val_shapes_report(self) -> dict[str, Any]:
        return {}

    def summary_settings(self) -> dict[str, Any]:
        """Model-specific choices a run made (merged into the summary's ``settings``): e.g. where
        SparseDrive's anchors came from."""
        return {}

    def loss_of_batch(self, batch: Any) -> dict[str, torch.Tensor]:
        return self.compute_loss(batch, self(batch))

    # ---- Lightning hooks ---------------------------------------------------------------------
    def forward(self, batch: Any) -> Any:
        return self.net(batch)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.graphed_loss is not None:
            losses = self.graphed_loss(self.static_batch(batch))
        else:
            losses = self.loss_of_batch(batch)
        bs = self.batch_size(batch)
        for name, value in losses.items():
            self.log(f"train/{name}", value.detach(), on_step=True, on_epoch=False, batch_size=bs,
                     prog_bar=(name == "loss"))
        return losses["loss"]

    eager_validation = False  # True: compiled units run eagerly in validation (see validation_step)

    def _eval_outputs(self, batch: Any) -> dict[str, torch.Tensor]:
        """The forward's outputs (``out/<name>``) and losses (``loss/<name>``) of a validation batch, with every
        unit eager: what :class:`GraphedForward` captures (compiled units would compile again for each
        validation shape, and the graph removes the launch cost that compiling would)."""
        with torch.compiler.set_stance("force_eager"):
            outputs = self(batch)
        losses = self.compute_loss(batch, outputs)
        return {**{f"out/{k}": v for k, v in outputs.items()}, **{f"loss/{k}": v for k, v in losses.items()}}

    def _graphed_validation(self) -> bool:
        # only inside a fit: its graphs point into cuBLAS workspaces that the fit's end frees (on_fit_start)
        return self.graphed_eval is not None and self.trainer.state.fn == "fit"

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        if self._graphed_validation():
            batch = self.static_val_batch(batch)
            flat = self.graphed_eval(batch)
            outputs = {k[len("out/"):]: v for k, v in flat.items() if k.startswith("out/")}
            losses = {k[len("loss/"):]: v for k, v in flat.items() if k.startswith("loss/")}
        else:
            # a model whose validation batches have shapes training never saw (QCNet: unpadded, every batch its
            # own edge counts) would compile its units again in eval mode, for minutes; it validates eagerly
            stance = torch.compiler.set_stance("force_eager") if self.eager_validation else contextlib.nullcontext()
            with stance:
                outputs = self(batch)
            losses = self.compute_loss(batch, outputs)
        bs = self.batch_size(batch)
        for name, value in losses.items():
            self.log(f"val/{name}", value.detach(), on_step=False, on_epoch=True, batch_size=bs, sync_dist=True)
        self.update_metrics(batch, outputs)

    def on_validation_epoch_start(self) -> None:
        self.reset_metrics()

    def metric_notes(self, values: dict[str, float]) -> dict[str, str]:
        """Notes on validation values a reader would misread alone (``summary.val_notes``): key -> note."""
        return {}

    def on_validation_epoch_end(self) -> None:
        # every rank computes the same, global values (torchmetrics syncs the states in compute):
        # averaging them again (sync_dist) would change nothing but cost a reduction per key
        for name, value in self.compute_metrics().items():
            self.log(f"val/{name}", float(value), sync_dist=False)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if self.run_config is not None:
            checkpoint[CONFIG_KEY] = self.run_config

    def optimizer_group_sizes(self) -> list[int] | None:
        """Parameters per optimizer group, as a fit would build them (None: no optimizer configured); a resume
        compares them with the checkpoint's before any work (``ckpt.resume.check_model_fits``)."""
        if self.optimizer_factory is None:
            return None
        return [len(g["params"]) for g in self.parameter_groups()]

    # ---- optimisation ------------------------------------------------------------------------
    def parameter_groups(self) -> list[dict[str, Any]]:
        """Split trainable parameters into decayed and non-decayed groups."""
        decay, no_decay = [], []
        for name, param in self.net.named_parameters():
            if not param.requires_grad:
                continue
            lname = name.lower()
            if param.ndim <= 1 or any(frag in lname for frag in self.no_weight_decay):
                no_decay.append(param)
            else:
                decay.append(param)
        groups: list[dict[str, Any]] = [{"params": decay}]
        if no_decay:
            groups.append({"params": no_decay, "weight_decay": 0.0})
        return groups

    def optimizer_kwargs(self) -> dict[str, Any]:
        """``fused=True`` for an optimizer that has a fused kernel, when ``accel.fused_optimizer`` asks."""
        target = getattr(self.optimizer_factory, "func", self.optimizer_factory)
        try:
            takes_fused = "fused" in inspect.signature(target).parameters
        except (TypeError, ValueError):
            takes_fused = False
        return {"fused": True} if self.fused_optimizer and takes_fused else {}

    def configure_optimizers(self) -> Any:
        optimizer = self.optimizer_factory(self.parameter_groups(), **self.optimizer_kwargs())
        # groups may carry ``lr_mult`` (e.g. the image backbone at 0.1x, mmcv's paramwise_cfg):
        # scaled before the scheduler is built, so it takes the scaled rates as its base
        for group in optimizer.param_groups:
            group["lr"] = group["lr"] * group.get("lr_mult", 1.0)
        if self.scheduler_factory is None:
            return optimizer
        scheduler = self.scheduler_factory(optimizer)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": self.scheduler_interval}}
