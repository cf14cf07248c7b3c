"""Image encoder of GaussianFormer: ResNet (optionally with DCNv2 in stages 3-4) + 4-level FPN.

Upstream: R101-DCN, caffe style, FCOS3D init, ``frozen_stages=1``, frozen BN (here frozen only with
``backbone_weights``: ``norm_eval="with_weights"``, see ``drivebench.models.common.backbone``); FPN over C3..C5
(``start_level=1``) with one extra level made by a stride-2 conv on ReLU(P5) (``add_extra_convs=
"on_output"``, ``relu_before_extra_convs=True``), 4 levels of d=128.
Differences here: torchvision's (pytorch-style) bottleneck puts the stride in the 3x3 conv, so the
first DCN of stages 3 and 4 is strided; DCNv2 runs through ``torchvision.ops.deform_conv2d``.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn
from torchvision.ops import deform_conv2d

from drivebench.models.common.backbone import FPN, MultiViewImageEncoder, NormEval, ResNetBackbone


class ModulatedDeformConv2d(nn.Module):
    """DCNv2 (modulated deformable conv) replacing a plain ``nn.Conv2d``; keeps its weight (and any
    pretrained values). Offsets and masks come from a zero-initialised conv, so at init it computes
    0.5 x the original conv (mask = sigmoid(0)), as mmcv's ``ModulatedDeformConv2dPack``."""

    def __init__(self, conv: nn.Conv2d) -> None:
        super().__init__()
        if conv.groups != 1:
            raise ValueError("ModulatedDeformConv2d supports groups=1 convolutions only")
        self.weight = conv.weight
        self.bias = conv.bias
        self.stride, self.padding, self.dilation = conv.stride, conv.padding, conv.dilation
        kh, kw = conv.kernel_size
        self.kernel_points = kh * kw
        self.offset_conv = nn.Conv2d(conv.in_channels, 3 * kh * kw, conv.kernel_size, conv.stride, conv.padding,
                                     conv.dilation, bias=True)
        nn.init.zeros_(self.offset_conv.weight)
        nn.init.zeros_(self.offset_conv.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.offset_conv(x)
        offset, mask = out[:, :2 * self.kernel_points], torch.sigmoid(out[:, 2 * self.kernel_points:])
        if x.device.type == "cpu" and torch.is_autocast_enabled("cpu"):
            # under CUDA autocast torchvision runs deform_conv2d in fp32 and casts the result back to the input's
            # dtype; it has no such rule and no bf16 kernel on the CPU (the bf16 step failed there): the same
            # fp32 island, so accel.precision=bf16-mixed works on a CPU as on a GPU
            with torch.autocast("cpu", enabled=False):
                bias = self.bias.float() if self.bias is not None else None
                return deform_conv2d(x.float(), offset.float(), self.weight.float(), bias, self.stride, self.padding,
                                     self.dilation, mask.float()).to(x.dtype)
        return deform_conv2d(x, offset, self.weight, self.bias, self.stride, self.padding, self.dilation, mask)


def add_deformable_convs(backbone: ResNetBackbone, stages: Sequence[int]) -> ResNetBackbone:
    """Swap the 3x3 ``conv2`` of every block in ``stages`` (0..3 = C2..C5) for DCNv2, in place."""
    for stage_idx in stages:
        for block in backbone.stages[stage_idx]:
            if not isinstance(getattr(block, "conv2", None), nn.Conv2d) or block.conv2.kernel_size != (3, 3):
                raise ValueError(f"stage {stage_idx} has no 3x3 conv2 to make deformable")
            block.conv2 = ModulatedDeformConv2d(block.conv2)
    return backbone


class FPNWithExtraLevel(nn.Module):
    """FPN over the given levels plus extra stride-2 levels computed from ReLU of the last output."""

    def __init__(self, in_channels: Sequence[int], out_channels: int, num_outs: int) -> None:
        super().__init__()
        if num_outs < len(in_channels):
            raise ValueError(f"num_outs={num_outs} is fewer than the {len(in_channels)} input levels")
        self.fpn = FPN(in_channels, out_channels)
        self.extra = nn.ModuleList(
            [nn.Conv2d(out_channels, out_channels, 3, stride=2, padding=1) for _ in range(num_outs - len(in_channels))]
        )
        self.out_channels = out_channels

    def forward(self, feats: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        outs = self.fpn(feats)
        for conv in self.extra:
            outs.append(conv(torch.relu(outs[-1])))
        return outs


def build_image_encoder(
    depth: str,
    embed_dims: int,
    dcn_stages: Sequence[int] = (2, 3),
    width_div: int = 1,
    weights: str | None = None,
    num_levels: int = 4,
    activation_checkpointing: bool = False,
    norm_eval: NormEval = "with_weights",
) -> MultiViewImageEncoder:
    """ResNet C3..C5 -> FPN with ``num_levels`` levels of ``embed_dims`` channels, frozen stem + stage 1;
    ``activation_checkpointing`` recomputes each residual block in backward (upstream ``with_cp``)."""
    backbone = ResNetBackbone(depth, out_indices=(1, 2, 3), frozen_stages=1, norm_eval=norm_eval, weights=weights,
                              width_div=width_div, activation_checkpointing=activation_checkpointing)
    add_deformable_convs(backbone, dcn_stages)
    neck = FPNWithExtraLevel(backbone.out_channels, embed_dims, num_levels)
    return MultiViewImageEncoder(backbone, neck)
