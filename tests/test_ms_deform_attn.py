"""Multi-scale deformable attention (MapTR's BEV attention): precision of the sampling under bf16."""

from __future__ import annotations

import torch

from drivebench.models.ops import multi_scale_deformable_attn


def test_bf16_values_are_sampled_at_float32_locations():
    """Under autocast the values are bf16 and the locations float32 (reference points plus offsets): the sampling
    positions must not be rounded to bf16 (upstream runs the op in float32). The error against float64 stays near
    the floor the values' own bf16 rounding sets."""
    gen = torch.Generator().manual_seed(0)
    shapes = [(50, 100)]  # MapTR's BEV at half the tiny size
    b, q, heads, dh, points = 1, 200, 4, 8, 4
    value = torch.randn(b, 50 * 100, heads, dh, generator=gen)
    locations = torch.rand(b, q, heads, 1, points, 2, generator=gen)
    weights = torch.softmax(torch.randn(b, q, heads, 1, points, generator=gen), dim=-1)
    ref = multi_scale_deformable_attn(value.double(), shapes, locations.double(), weights.double())
    floor = multi_scale_deformable_attn(value.bfloat16().double(), shapes, locations.double(), weights.double())

    def rms_error(out: torch.Tensor) -> float:
        return (out.double() - ref).pow(2).mean().sqrt().item()

    out = multi_scale_deformable_attn(value.bfloat16(), shapes, locations, weights)
    assert out.dtype == torch.bfloat16
    assert 0 < rms_error(out) < 3 * rms_error(floor), (rms_error(out), rms_error(floor))
