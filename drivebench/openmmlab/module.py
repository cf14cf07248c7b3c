"""An mmdet3d model inside drivebench's LightningModule contract.

* :class:`MMDet3DNet` holds the model built by mmdet3d's registry; ``forward`` returns its loss
  dict (``mode='loss'``), ``compile_units`` names what ``accel.compile`` compiles
  (``model.net.compile_scope``: nothing by default, or the dense backbones, necks and heads), and
  ``device_transform`` is the model's ``data_preprocessor`` (voxelisation, padding), which
  ``drivebench.app`` hands the datamodule as its device transform (timed as ``gpu_preprocess``).
* :class:`MMDet3DModule` sums the losses with the model's
  own ``parse_losses``, and by default builds the optimizer, its parameter groups, the gradient
  clipping and the LR schedulers from the config's ``optim_wrapper`` / ``param_scheduler``, as
  mmengine's runner would, so the two runners train the same way.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from drivebench.errors import ConfigError
from drivebench.lit.base import DriveModule
from drivebench.openmmlab import register_mmdet3d
from drivebench.openmmlab.configs import load_config
from drivebench.openmmlab.voxelize import VOXELIZERS, SortedVoxelization

COMPILE_SUFFIXES = ("backbone", "neck", "bbox_head")
COMPILE_SCOPES = ("none", "dense")


class MMDet3DNet(nn.Module):
    """The mmdet3d model plus the parts of its config that training needs (optimizer, schedules)."""

    def __init__(self, model: nn.Module, optim_wrapper: dict, param_scheduler: list[dict], source: dict,
                 compile_scope: str = "none") -> None:
        super().__init__()
        if compile_scope not in COMPILE_SCOPES:
            raise ConfigError(f"model.net.compile_scope={compile_scope!r} is not valid; choose one of: "
                              f"{', '.join(COMPILE_SCOPES)}")
        self.compile_scope = compile_scope
        self.model = model
        self.optim_wrapper_cfg = optim_wrapper
        self.param_scheduler_cfg = param_scheduler
        self.source = source  # config path, preset and overrides, for the summary

    def _apply(self, fn: Callable, recurse: bool = True) -> "MMDet3DNet":
        """Keep mmengine's device record with the weights after any move.

        mmengine's data preprocessor casts batches to a device it records in its own ``to()`` /
        ``cuda()``; Lightning moves the LightningModule with ``nn.Module.to``, whose recursion calls
        ``_apply`` and never the children's ``to()``, so the record stayed ``cpu`` and the batch was
        voxelised on the host while the weights sat on the GPU (H200, part 11)."""
        super()._apply(fn, recurse)
        param = next(self.model.parameters(), None)
        if param is not None and hasattr(self.model, "_set_device"):
            self.model._set_device(param.device)
        return self

    def preprocess(self, batch: dict, training: bool) -> dict:
        """The model's data_preprocessor: device cast, voxelisation, padding (and batch augments)."""
        return self.model.data_preprocessor(batch, training)

    def device_transform(self, batch: dict) -> dict:
        """:meth:`preprocess` in the mode the net is in (Lightning sets it: train, or eval to validate):
        the datamodule's device transform for this model."""
        return self.preprocess(batch, self.training)

    def forward(self, batch: dict) -> dict[str, Any]:
        return self.model(**batch, mode="loss")

    def compile_units(self) -> dict[str, nn.Module]:
        """What ``accel.compile`` compiles. ``none`` (default): nothing; on the H200 (PointPillars at
        config size, bf16, 2026-11-30 part 11) the compiled ``dense`` parts ran 14.1-14.5 samples/s
        against 15.3 eager. ``dense``: backbones, necks and heads (voxel encoders and scatters have
        data-dependent shapes)."""
        if self.compile_scope == "none":
            return {}
        return {name: m for name, m in self.model.named_children() if name.endswith(COMPILE_SUFFIXES)}


def build_net(config: str, preset: str = "config", cfg_options: dict | None = None,
              compile_scope: str = "none", voxelizer: str = "mmcv") -> MMDet3DNet:
    """Build ``config``'s model through mmdet3d's registry and initialise its weights (as the runner does);
    ``voxelizer="sorted"`` swaps mmcv's hard voxelisation layer for :class:`SortedVoxelization`."""
    register_mmdet3d()
    from mmdet3d.registry import MODELS

    if voxelizer not in VOXELIZERS:
        raise ConfigError(f"model.net.voxelizer={voxelizer!r} is not valid; choose one of: {', '.join(VOXELIZERS)}")
    cfg = load_config(config, preset, cfg_options)
    model = MODELS.build(cfg.model)
    if hasattr(model, "init_weights"):
        model.init_weights()
    if voxelizer == "sorted":
        use_sorted_voxelization(model, config)
    optim = cfg.get("optim_wrapper")
    if optim is None:
        raise ConfigError(f"{config}: the config has no optim_wrapper; set model.optimizer to a torch optimizer")
    scheds = cfg.get("param_scheduler") or []
    if isinstance(scheds, dict):
        scheds = [scheds]
    return MMDet3DNet(model, optim.to_dict() if hasattr(optim, "to_dict") else dict(optim),
                      [dict(s) for s in scheds], dict(cfg._drivebench), compile_scope)


def use_sorted_voxelization(model: nn.Module, config: str) -> None:
    """Replace every hard-voxelisation layer (``voxel_layer`` with ``max_num_points`` > 0) in place."""
    replaced = 0
    for module in model.modules():
        layer = getattr(module, "voxel_layer", None)
        if isinstance(layer, nn.Module) and getattr(layer, "max_num_points", -1) > 0:
            module.voxel_layer = SortedVoxelization.like(layer)
            replaced += 1
    if not replaced:
        raise ConfigError(f"model.net.voxelizer=sorted: {config} has no hard voxelisation layer (a data "
                          "preprocessor voxel_layer with max_num_points > 0); use model.net.voxelizer=mmcv")


class MMDet3DModule(DriveModule):
    """Train an :class:`MMDet3DNet`. ``optimizer``/``scheduler`` None: the config's (as mmengine builds them)."""

    def __init__(self, net: MMDet3DNet, optimizer: Callable | None = None, scheduler: Callable | None = None,
                 scheduler_interval: str = "step") -> None:
        super().__init__(net, optimizer, scheduler, scheduler_interval)
        clip = (net.optim_wrapper_cfg or {}).get("clip_grad") or None
        if clip and float(clip.get("norm_type", 2)) != 2.0:
            raise ConfigError(f"optim_wrapper.clip_grad={clip}: drivebench clips by the 2-norm only")
        self.clip_grad = clip

    # ---- DriveModule contract -----------------------------------------------------------------
    def compute_loss(self, batch: Any, outputs: dict[str, Any]) -> dict[str, torch.Tensor]:
        loss, log_vars = self.net.model.parse_losses(outputs)
        return {"loss": loss, **{k: v for k, v in log_vars.items() if k != "loss"}}

    def batch_size(self, batch: Any) -> int:
        return len(batch["data_samples"])

    # ---- optimisation from the config ---------------------------------------------------------
    def configure_optimizers(self) -> Any:
        if self.optimizer_factory is not None:
            return super().configure_optimizers()
        from mmengine.optim import build_optim_wrapper
        from mmengine.registry import PARAM_SCHEDULERS

        wrapper = {k: v for k, v in self.net.optim_wrapper_cfg.items() if k not in ("dtype", "loss_scale")}
        wrapper["type"] = "OptimWrapper"  # precision is accel.precision's job (Lightning's plugin)
        wrapper.pop("clip_grad", None)  # clipped in configure_gradient_clipping
        optimizer = build_optim_wrapper(self.net.model, wrapper).optimizer
        if self.scheduler_factory is not None:
            scheduler = self.scheduler_factory(optimizer)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": self.scheduler_interval}}
        schedulers = []
        for spec in self.net.param_scheduler_cfg:
            sched = PARAM_SCHEDULERS.build({**spec, "optimizer": optimizer})
            schedulers.append({"scheduler": sched, "interval": "epoch" if sched.by_epoch else "step"})
        return [optimizer], schedulers

    def lr_scheduler_step(self, scheduler: Any, metric: Any) -> None:
        scheduler.step()  # mmengine's ParamScheduler: step() like torch's, without the metric

    def configure_gradient_clipping(self, optimizer: torch.optim.Optimizer, gradient_clip_val: Any = None,
                                    gradient_clip_algorithm: Any = None) -> None:
        if gradient_clip_val is None and self.clip_grad:
            gradient_clip_val, gradient_clip_algorithm = float(self.clip_grad["max_norm"]), "norm"
        self.clip_gradients(optimizer, gradient_clip_val=gradient_clip_val,
                            gradient_clip_algorithm=gradient_clip_algorithm)
