"""GridMask image augmentation applied inside the model during training (upstream ``use_grid_mask``).

Upstream draws one mask per batch with numpy on the host, rotates it with PIL and copies it to the
GPU. With MapTR's settings (``rotate=1`` draws angle 0, ``mode=1``, ``ratio=0.5``, ``prob=0.7``,
no offset) the mask is a grid of horizontal and vertical stripes. Here every random draw is a
device tensor and the mask is built on the device: no host-to-device copy, no sync, and no Python
branch on random values (so ``torch.compile`` neither breaks the graph nor recompiles per draw).
"""

from __future__ import annotations

import torch
from torch import nn


class GridMask(nn.Module):
    """Keep the stripes of a random grid, zero the squares between them (upstream mode 1).

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
        h, w = imgs.shape[-2:]
        if not self.training or h < 3:
            return imgs
        dev = imgs.device
        period = torch.randint(2, h, (), device=dev)  # upstream: np.random.randint(2, h)
        width = torch.minimum((period * self.ratio + 0.5).floor().long().clamp(min=1), period - 1)
        start_h = (torch.rand((), device=dev) * period).floor().long()  # uniform in [0, period)
        start_w = (torch.rand((), device=dev) * period).floor().long()
        hh, ww = int(1.5 * h), int(1.5 * w)
        rows = self._stripes(hh, period, width, start_h, dev)[(hh - h) // 2:(hh - h) // 2 + h]
        cols = self._stripes(ww, period, width, start_w, dev)[(ww - w) // 2:(ww - w) // 2 + w]
        skip = torch.rand((), device=dev) > self.prob
        keep = rows[:, None] | cols[None, :] | skip
        return imgs * keep.to(imgs.dtype)

    @staticmethod
    def _stripes(length: int, period: torch.Tensor, width: torch.Tensor, start: torch.Tensor,
                 device: torch.device) -> torch.Tensor:
        """bool (length,): True on [start + k*period, start + k*period + width) for k < length // period."""
        pos = torch.arange(length, device=device) - start
        return (pos >= 0) & (pos % period < width) & (torch.div(pos, period, rounding_mode="floor") < length // period)
