"""Small dense building blocks of the GaussianFormer encoder (upstream: Sparse4D-style helpers)."""

from __future__ import annotations

import torch
from torch import nn


def linear_relu_ln(embed_dims: int, in_loops: int, out_loops: int, input_dims: int | None = None) -> nn.Sequential:
    """``out_loops`` x ([Linear, ReLU] x ``in_loops`` + LayerNorm): upstream's embedding/refinement MLP shape."""
    layers: list[nn.Module] = []
    dims = input_dims or embed_dims
    for _ in range(out_loops):
        for _ in range(in_loops):
            layers += [nn.Linear(dims, embed_dims), nn.ReLU(inplace=True)]
            dims = embed_dims
        layers.append(nn.LayerNorm(embed_dims))
    return nn.Sequential(*layers)


class ChannelScale(nn.Module):
    """Learnable per-channel multiplier (mmcv ``Scale`` with a vector), initialised to 1."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale


class AsymmetricFFN(nn.Module):
    """FFN from ``in_dims`` (2d: aggregation output concatenated with the residual) down to ``embed_dims``.

    As upstream: pre-LayerNorm on the input, two linears with ReLU and dropout, and a linear identity
    branch (in_dims != embed_dims) applied to the normalised input.
    """

    def __init__(self, in_dims: int, embed_dims: int, hidden_dims: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.pre_norm = nn.LayerNorm(in_dims)
        self.layers = nn.Sequential(
            nn.Linear(in_dims, hidden_dims), nn.ReLU(inplace=True), nn.Dropout(dropout),
            nn.Linear(hidden_dims, embed_dims), nn.Dropout(dropout),
        )
        self.identity_fc = nn.Identity() if in_dims == embed_dims else nn.Linear(in_dims, embed_dims)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pre_norm(x)
        return self.identity_fc(x) + self.layers(x)
