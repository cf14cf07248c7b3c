"""GridMask image augmentation applied inside the model during training (upstream ``use_grid_mask``).

Upstream draws one mask per batch with numpy on the host, rotates it with PIL and copies it to the
GPU. With MapTR's settings (``rotate=1`` draws angle 0, ``mode=1``, ``ratio=0.5``, ``prob=0.7``,
no offset) the mask is a grid of horizontal and vertical stripes; here it is built on the device
from a few host-drawn integers, so there is no host-to-device copy and no sync.
"""

from __future__ import annotations

import random

import torch
from torch import nn


class GridMask(nn.Module):
    """Keep the stripes of a random grid, zero the squares between them (mode 1).

    Args:
        prob: probability of masking a batch (training only).
        ratio: stripe width as a fraction of the grid period.
    """

    def __init__(self, prob: float = 0.7, ratio: float = 0.5) -> None:
        super().__init__()
        self.prob = prob
        self.ratio = ratio

    def forward(self, imgs: torch.Tensor) -> torch.Tensor:
        """imgs: (..., H, W); the same mask for every image of the batch, as upstream."""
        if not self.training or random.random() > self.prob:
            return imgs
        h, w = imgs.shape[-2:]
        if h < 3:
            return imgs
        hh, ww = int(1.5 * h), int(1.5 * w)
        period = random.randint(2, h - 1)
        width = min(max(int(period * self.ratio + 0.5), 1), period - 1)
        start_h, start_w = random.randrange(period), random.randrange(period)
        rows = self._stripes(hh, period, width, start_h, imgs.device)[(hh - h) // 2:(hh - h) // 2 + h]
        cols = self._stripes(ww, period, width, start_w, imgs.device)[(ww - w) // 2:(ww - w) // 2 + w]
        keep = (rows[:, None] | cols[None, :]).to(imgs.dtype)
        return imgs * keep

    @staticmethod
    def _stripes(length: int, period: int, width: int, start: int, device: torch.device) -> torch.Tensor:
        """bool (length,): True on [start + k*period, start + k*period + width) for k < length // period."""
        pos = torch.arange(length, device=device) - start
        return (pos >= 0) & (pos % period < width) & (pos // period < length // period)
