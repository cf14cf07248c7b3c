"""Optimizer parameter groups that give the image backbone its own learning rate.

One mechanism (mmcv's ``paramwise_cfg``): a group carries ``lr_mult`` and
``DriveModule.configure_optimizers`` multiplies its learning rate by it before the scheduler is
built, so schedulers take the scaled rates as their base. The two helpers here differ only in
which parameters escape weight decay, as upstream's models do; each keeps the group order its
model always had (optimizer state in a checkpoint is stored by group position).
"""

from __future__ import annotations

from typing import Any, Iterable

from torch import nn


def backbone_and_name_decay_groups(named_parameters: Iterable[tuple[str, nn.Parameter]], backbone: nn.Module,
                                   lr_mult: float, no_weight_decay: tuple[str, ...]) -> list[dict[str, Any]]:
    """MapTR's and SparseDrive's groups (mmcv's default constructor): every trainable parameter
    decays unless its name holds a ``no_weight_decay`` fragment; backbone groups get ``lr_mult``.

    Order: (rest, no decay), (rest, decay), (backbone, no decay), (backbone, decay); empty ones left out.
    """
    backbone_ids = {id(p) for p in backbone.parameters()}
    buckets: dict[tuple[bool, bool], list[nn.Parameter]] = {}
    for name, param in named_parameters:
        if not param.requires_grad:
            continue
        decays = not any(frag in name.lower() for frag in no_weight_decay)
        buckets.setdefault((id(param) in backbone_ids, decays), []).append(param)
    groups = []
    for (is_backbone, decays), params in sorted(buckets.items()):
        group: dict[str, Any] = {"params": params}
        if is_backbone:
            group["lr_mult"] = lr_mult
        if not decays:
            group["weight_decay"] = 0.0
        groups.append(group)
    return groups


def split_off_backbone(groups: list[dict[str, Any]], backbone: nn.Module, lr_mult: float) -> list[dict[str, Any]]:
    """Each of ``groups`` split in two, its other parameters first, then its backbone parameters with
    ``lr_mult`` (GaussianFormer: ``DriveModule``'s decay / no-decay groups, backbone at 0.1x)."""
    backbone_ids = {id(p) for p in backbone.parameters()}
    out: list[dict[str, Any]] = []
    for group in groups:
        extra = {k: v for k, v in group.items() if k != "params"}
        rest = [p for p in group["params"] if id(p) not in backbone_ids]
        inside = [p for p in group["params"] if id(p) in backbone_ids]
        if rest:
            out.append({"params": rest, **extra})
        if inside:
            out.append({"params": inside, **extra, "lr_mult": lr_mult})
    return out


__all__ = ["backbone_and_name_decay_groups", "split_off_backbone"]
