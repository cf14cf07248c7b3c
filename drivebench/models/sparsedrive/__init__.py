"""SparseDrive (Sun et al., 2024, arXiv:2405.19620; upstream swc-17/SparseDrive ``sparsedrive_small``).

Sizes:
- ``small``: upstream SparseDrive-S (R50 + 4-level FPN, 900 det / 100 map anchors, 6 decoder
  layers, 13 / 300 keypoints, 3 motion layers). ``stage=1`` trains detection + map, ``stage=2``
  (default) adds motion prediction and planning.
- ``test``: a shrunk network with the same structure for CPU tests (``width_div`` backbone,
  d=32, few anchors, layers and keypoints).
"""

from __future__ import annotations

from typing import Any

from drivebench.models.registry import register_model
from drivebench.models.sparsedrive.model import DETECTION_CLASSES, MAP_CLASSES, SparseDrive, SparseDriveOutput

_SMALL: dict[str, Any] = {}  # the constructor defaults are upstream's sparsedrive_small

_TEST: dict[str, Any] = dict(
    depth="resnet18", width_div=8, dims=32, num_heads=2, num_groups=2, num_layers=2, num_single_frame=1,
    num_det_anchors=24, num_det_temp=12, num_det_learnable_pts=2, num_map_anchors=8, num_map_temp=None,
    num_map_learnable_pts=1, map_fix_height=(0.0,), num_motion_layers=1, num_det_for_motion=8,
    num_map_for_motion=4, num_depth_layers=3, dropout=0.0,
)


@register_model(
    "sparsedrive",
    sizes={"small": _SMALL, "test": _TEST},
    default_size="small",
    input_size=(704, 256),  # (W, H) after upstream's resize/crop
    test_input_size=(176, 64),
    num_cams=6,
    detection_classes=DETECTION_CLASSES,
    map_classes=MAP_CLASSES,
    detection_range=55.0,  # metres; upstream CircleObjectRangeFilter
    map_roi=(30.0, 60.0),  # (x extent, y extent) in metres around the lidar (nuScenes LIDAR_TOP: y forward)
    fut_ts=12,
    ego_fut_ts=6,
    img_mean=(123.675, 116.28, 103.53),
    img_std=(58.395, 57.12, 57.375),
    image_multiple=32,
)
def build_sparsedrive(**kwargs: Any) -> SparseDrive:
    """Build SparseDrive; every keyword is a ``SparseDrive`` argument."""
    return SparseDrive(**kwargs)


__all__ = ["SparseDrive", "SparseDriveOutput", "build_sparsedrive", "DETECTION_CLASSES", "MAP_CLASSES"]
