"""Feature scale of the image backbones at random init: frozen BatchNorm against trained BatchNorm.

Why: upstream freezes BN because it loads pretrained weights; from random weights a frozen BN holds
statistics 0/1 and is the identity, so the residual stack runs un-normalised. This prints the standard
deviation of each returned stage (C2..C5) on a unit-variance image, in training mode, for the backbones
the models build. Run: ``python scripts/backbone_scale.py`` (CPU, ~1 min).
"""

from __future__ import annotations

import torch

from drivebench.models.common.backbone import NormEval, ResNetBackbone

CASES = [  # (label, depth, width_div)
    ("ResNet-18 (MapTR nano)", "resnet18", 1),
    ("ResNet-50 (MapTR tiny)", "resnet50", 1),
    ("ResNet-101 (GaussianFormer; no DCN here)", "resnet101", 1),
    ("ResNet-18 / 8 (MapTR test)", "resnet18", 8),
    ("ResNet-50 / 16 (GaussianFormer test; no DCN here)", "resnet50", 16),
]


def stage_std(depth: str, width_div: int, norm_eval: NormEval, image: torch.Tensor) -> list[float]:
    torch.manual_seed(0)
    backbone = ResNetBackbone(depth, out_indices=(0, 1, 2, 3), frozen_stages=1, norm_eval=norm_eval,
                              width_div=width_div).train()
    with torch.no_grad():
        return [float(f.std()) for f in backbone(image)]


def main() -> None:
    torch.manual_seed(0)
    image = torch.randn(2, 3, 224, 384)
    print("| backbone | BatchNorm | C2 | C3 | C4 | C5 |\n|---|---|---|---|---|---|")
    for label, depth, width_div in CASES:
        for norm_eval, name in ((True, "frozen (identity at random init)"), ("with_weights", "trained")):
            stds = stage_std(depth, width_div, norm_eval, image)
            print(f"| {label} | {name} | " + " | ".join(f"{s:.3g}" for s in stds) + " |")


if __name__ == "__main__":
    main()
