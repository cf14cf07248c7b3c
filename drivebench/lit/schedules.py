"""Learning-rate schedules of the upstream recipes (mmcv's CosineAnnealing with linear warm-up)."""

from __future__ import annotations

import math

import torch
from torch.optim.lr_scheduler import LambdaLR


def warmup_cosine(optimizer: torch.optim.Optimizer, total_steps: int, warmup_steps: int = 500,
                  warmup_ratio: float = 1.0 / 3, min_lr_ratio: float = 1e-3) -> LambdaLR:
    """Linear warm-up from ``warmup_ratio`` x lr over ``warmup_steps``, then cosine to ``min_lr_ratio`` x lr
    at ``total_steps`` (held there afterwards). Stepped every optimizer step."""
    if total_steps < 1 or warmup_steps < 0:
        raise ValueError(f"total_steps must be >= 1 and warmup_steps >= 0, got {total_steps}, {warmup_steps}")

    def factor(step: int) -> float:
        if step < warmup_steps:
            return warmup_ratio + (1.0 - warmup_ratio) * step / warmup_steps
        progress = min((step - warmup_steps) / max(total_steps - warmup_steps, 1), 1.0)
        return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return LambdaLR(optimizer, factor)
