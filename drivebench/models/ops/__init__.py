"""Operators shared by the camera models, in plain PyTorch (no compiled extensions)."""

from drivebench.models.ops.deformable_aggregation import deformable_aggregation, masked_point_softmax
from drivebench.models.ops.ms_deform_attn import multi_scale_deformable_attn

__all__ = ["deformable_aggregation", "masked_point_softmax", "multi_scale_deformable_attn"]
