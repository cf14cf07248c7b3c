"""ResNet image backbone (torchvision, random init) and an FPN neck, for multi-camera models.

Why our own thin wrapper: the upstream repos use mmdet's ResNet with ``frozen_stages`` and frozen
BatchNorm; torchvision's ResNet has the same layers, so we freeze the same parts here. Pretrained
weights are optional and come from a local file (nothing is downloaded).

Frozen BatchNorm keeps the statistics of the weights it was loaded with. Upstream loads ImageNet
weights, so its frozen BN normalises; from random init the statistics are mean 0, variance 1 and a
frozen BN is the identity: the residual stack then runs un-normalised and its output grows with
depth (at random init, on a unit-variance image: C5 standard deviation ~38 for a ResNet-50 and ~3e4
for a ResNet-101, against ~1.2 with BatchNorm that normalises; ``scripts/backbone_scale.py``).
``norm_eval="with_weights"`` (the models' setting) therefore freezes BN only when a weights file is
loaded and otherwise trains it, as upstream's MapTR nano and SparseDrive configs train theirs.
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Literal, Sequence, Union

import torch
import torch.nn.functional as F
import torchvision
from torch import nn
from torchvision.ops.misc import FrozenBatchNorm2d

from drivebench.models.common.checkpointing import run_blocks

NormEval = Union[bool, Literal["with_weights"]]


def frozen_norm(norm_eval: NormEval, weights: str | None) -> bool:
    """Whether the backbone's BatchNorm is frozen: ``norm_eval`` itself, or for ``"with_weights"``
    whether pretrained weights are loaded (frozen statistics of random weights are the identity)."""
    if norm_eval == "with_weights":
        return bool(weights)
    if isinstance(norm_eval, bool):
        return norm_eval
    raise ValueError(f"norm_eval={norm_eval!r} is not valid; use true (frozen BatchNorm), false (trained) or "
                     "with_weights (frozen only when backbone_weights is set)")


_RESNETS = {
    "resnet18": (torchvision.models.resnet18, (64, 128, 256, 512)),
    "resnet34": (torchvision.models.resnet34, (64, 128, 256, 512)),
    "resnet50": (torchvision.models.resnet50, (256, 512, 1024, 2048)),
    "resnet101": (torchvision.models.resnet101, (256, 512, 1024, 2048)),
}


def load_resnet_weights(net: nn.Module, path: Path, what: str) -> None:
    """A torchvision ResNet state_dict file into ``net`` (its ``fc.`` classifier left out, other missing keys allowed,
    as upstream loads ImageNet weights). ValueError naming ``backbone_weights`` (the models' argument) for a file that
    is not such a state_dict or shares no parameter with this ResNet: strict=False alone would load nothing silently.
    A leading ``~`` is expanded, as the pre-run check (drivebench.app) reads the same value."""
    path = path.expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"backbone weights file {path} does not exist; set model.net.backbone_weights=null "
                                "to train from random init")
    try:
        # memory-mapped where the format allows: the pre-run check builds the net on the meta device, whose copy
        # reads no tensor data, so the file's tensors are read once, by the run's own build
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(path))
    except Exception as err:  # noqa: BLE001 - any unreadable file is the same mistake
        raise ValueError(f"backbone_weights={path} is not a state_dict torch.load can read ({type(err).__name__}); "
                         "give a torchvision ResNet state_dict file") from err
    if not isinstance(state, dict):
        raise ValueError(f"backbone_weights={path} holds a {type(state).__name__}, not a state_dict; give a "
                         "torchvision ResNet state_dict file")
    state = {k: v for k, v in state.items() if not str(k).startswith("fc.")}
    if not set(state) & set(net.state_dict()):
        raise ValueError(f"backbone_weights={path} shares no parameter name with a torchvision {what}; give "
                         "that network's state_dict file")
    try:
        net.load_state_dict(state, strict=False)
    except RuntimeError as err:
        first = str(err).strip().splitlines()[-1].strip()
        raise ValueError(f"backbone_weights={path} does not fit a torchvision {what}: {first}") from err


class ResNetBackbone(nn.Module):
    """Returns the feature maps of the requested stages (indices 0..3 = C2..C5).

    Args:
        depth: one of resnet18/34/50/101.
        out_indices: stages to return, e.g. (3,) for C5 only (MapTR) or (0, 1, 2, 3).
        frozen_stages: stem + the first ``frozen_stages`` stages get no gradient (-1: none).
        norm_eval: frozen BatchNorm (statistics and affine fixed) when true, as upstream configs do
            with pretrained weights; ``"with_weights"``: frozen only when ``weights`` is given
            (see the module docstring). ``self.frozen_norm`` holds the resolved choice.
        weights: optional path to a torchvision state_dict.
        width_div: divide channel widths (CPU test sizes); 1 for the real networks.
        activation_checkpointing: recompute each residual block in backward instead of keeping its
            activations (mmcv ``with_cp``; ``drivebench.models.common.checkpointing``). Switchable
            after construction through the attribute of the same name.
    """

    supports_activation_checkpointing = True

    def __init__(
        self,
        depth: str = "resnet50",
        out_indices: Sequence[int] = (0, 1, 2, 3),
        frozen_stages: int = 1,
        norm_eval: NormEval = "with_weights",
        weights: str | None = None,
        width_div: int = 1,
        activation_checkpointing: bool = False,
    ) -> None:
        super().__init__()
        self.activation_checkpointing = bool(activation_checkpointing)
        if depth not in _RESNETS:
            raise ValueError(f"backbone depth={depth!r}; valid choices: {', '.join(_RESNETS)}")
        ctor, channels = _RESNETS[depth]
        self.frozen_norm = frozen_norm(norm_eval, weights)
        kwargs = {"norm_layer": FrozenBatchNorm2d} if self.frozen_norm else {}
        net = ctor(weights=None, **kwargs)
        if width_div != 1:
            net = _shrink_resnet(net, width_div)
            channels = tuple(c // width_div for c in channels)
        if weights:
            load_resnet_weights(net, Path(weights), depth if width_div == 1 else f"{depth} at 1/{width_div} width")
        self.stem = nn.Sequential(net.conv1, net.bn1, net.relu, net.maxpool)
        self.stages = nn.ModuleList([net.layer1, net.layer2, net.layer3, net.layer4])
        self.out_indices = tuple(out_indices)
        self.out_channels = tuple(channels[i] for i in self.out_indices)
        if frozen_stages >= 0:
            for p in self.stem.parameters():
                p.requires_grad_(False)
            for stage in self.stages[:frozen_stages]:
                for p in stage.parameters():
                    p.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        x = self.stem(x)
        outs = []
        for i, stage in enumerate(self.stages):
            x = run_blocks(stage, x, self.activation_checkpointing)
            if i in self.out_indices:
                outs.append(x)
            if i >= max(self.out_indices):
                break
        return outs


def _shrink_resnet(net: nn.Module, div: int) -> nn.Module:
    """Rebuild every conv/bn of a torchvision ResNet with 1/div of its channels (test sizes only)."""
    for name, module in list(net.named_modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, nn.Conv2d):
                in_c = child.in_channels if child.in_channels == 3 else max(child.in_channels // div, 1)
                new = nn.Conv2d(in_c, max(child.out_channels // div, 1), child.kernel_size, child.stride,
                                child.padding, bias=child.bias is not None)
                setattr(module, child_name, new)
            elif isinstance(child, (nn.BatchNorm2d, FrozenBatchNorm2d)):
                setattr(module, child_name, type(child)(max(child.weight.shape[0] // div, 1)))
    return net


class FPN(nn.Module):
    """Feature pyramid: lateral 1x1 convs, top-down sum, 3x3 output convs; optional extra levels."""

    def __init__(self, in_channels: Sequence[int], out_channels: int = 256, num_outs: int | None = None) -> None:
        super().__init__()
        self.lateral = nn.ModuleList([nn.Conv2d(c, out_channels, 1) for c in in_channels])
        self.output = nn.ModuleList([nn.Conv2d(out_channels, out_channels, 3, padding=1) for _ in in_channels])
        self.num_outs = num_outs or len(in_channels)
        self.extra = nn.ModuleList(
            [nn.Conv2d(out_channels, out_channels, 3, stride=2, padding=1)
             for _ in range(self.num_outs - len(in_channels))]
        )
        self.out_channels = out_channels

    def forward(self, feats: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        lat = [conv(f) for conv, f in zip(self.lateral, feats)]
        for i in range(len(lat) - 1, 0, -1):
            lat[i - 1] = lat[i - 1] + F.interpolate(lat[i], size=lat[i - 1].shape[-2:], mode="nearest")
        outs = [conv(x) for conv, x in zip(self.output, lat)]
        for conv in self.extra:
            outs.append(conv(outs[-1]))
        return outs


class MultiViewImageEncoder(nn.Module):
    """Backbone + FPN over (B, N_cam, 3, H, W) images; returns per level (B, N_cam, C, H_l, W_l)."""

    def __init__(self, backbone: ResNetBackbone, neck: FPN) -> None:
        super().__init__()
        self.backbone = backbone
        self.neck = neck

    def forward(self, imgs: torch.Tensor) -> list[torch.Tensor]:
        b, n = imgs.shape[:2]
        feats = self.neck(self.backbone(imgs.flatten(0, 1)))
        return [f.view(b, n, *f.shape[1:]) for f in feats]
