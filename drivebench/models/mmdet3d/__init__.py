"""``model=mmdet3d``: any mmdetection3d config, built by mmdet3d's registry (drivebench/openmmlab).

Registered like the native models so that names and sizes are validated the same way; the sizes
are presets computed from the config (drivebench/openmmlab/presets.py). Importing this package
does not import OpenMMLab: the builder does, and says how to install it when it is missing.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from drivebench.models.registry import register_model
from drivebench.openmmlab.presets import DEPRECATED_PRESETS, PRESETS


@register_model("mmdet3d", sizes={name: {"preset": name} for name in PRESETS}, default_size="config",
                deprecated_sizes=DEPRECATED_PRESETS, upstream="mmdetection3d 1.4.0")
def build_mmdet3d(preset: str, config: str, cfg_options: dict[str, Any] | None = None,
                  compile_scope: str = "none", voxelizer: str = "mmcv") -> nn.Module:
    """The config's model at size ``preset`` with ``cfg_options`` on top (an MMDet3DNet)."""
    from drivebench.openmmlab.module import build_net

    return build_net(config, preset, cfg_options, compile_scope, voxelizer)
