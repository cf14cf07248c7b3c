"""The small dense bricks that Sparse4D's descendants (SparseDrive, GaussianFormer) build their heads from.

Both upstream repositories define these same pieces (an MLP of Linear-ReLU-LayerNorm loops, a per-channel
scale, a pre-norm FFN whose identity is projected); here they are written once.
"""

from __future__ import annotations

import torch
from torch import nn


def linear_relu_ln(dims: int, in_loops: int, out_loops: int, input_dims: int | None = None) -> nn.Sequential:
    """``out_loops`` x (``in_loops`` x (Linear, ReLU), LayerNorm): the MLP brick of Sparse4D."""
    layers: list[nn.Module] = []
    in_dims = input_dims or dims
    for _ in range(out_loops):
        for _ in range(in_loops):
            layers += [nn.Linear(in_dims, dims), nn.ReLU(inplace=True)]
            in_dims = dims
        layers.append(nn.LayerNorm(dims))
    return nn.Sequential(*layers)


class Scale(nn.Module):
    """Learnable per-channel output scale (mmcv ``Scale`` with a vector init)."""

    def __init__(self, dims: int, init: float = 1.0) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.full((dims,), init))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale


class AsymmetricFFN(nn.Module):
    """Pre-norm FFN whose input width may differ from its output (the identity branch is then a linear).

    ``xavier_init``: GaussianFormer's encoder re-initialises the FFN's linears with Xavier-uniform, as its upstream
    does; SparseDrive keeps PyTorch's default initialisation.
    """

    def __init__(self, in_dims: int, dims: int, hidden: int, dropout: float = 0.0, xavier_init: bool = False) -> None:
        super().__init__()
        self.pre_norm = nn.LayerNorm(in_dims)
        self.layers = nn.Sequential(
            nn.Linear(in_dims, hidden), nn.ReLU(inplace=True), nn.Dropout(dropout),
            nn.Linear(hidden, dims), nn.Dropout(dropout),
        )
        self.identity_fc = nn.Identity() if in_dims == dims else nn.Linear(in_dims, dims)
        if xavier_init:
            for module in self.modules():
                if isinstance(module, nn.Linear):
                    nn.init.xavier_uniform_(module.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pre_norm(x)
        return self.identity_fc(x) + self.layers(x)
