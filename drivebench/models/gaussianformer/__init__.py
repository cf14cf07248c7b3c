"""GaussianFormer registered as ``gaussianformer``: sizes gs25600 (default), gs144000, gs25600_r50, test.

Sizes follow huang-yh/GaussianFormer ``config/nuscenes_gs25600_solid.py`` and ``nuscenes_gs144000.py``:

* ``gs25600``  (solid): 25,600 Gaussians, opacity, 17 softplus semantics + one fixed "empty" Gaussian,
  scales in [0.08, 0.64] m, mean steps <= (4, 4, 1) m, sparse conv with output linear, only the last
  layer supervised (``apply_loss_type="random_1"``). ~57.0M parameters with R101-DCN.
* ``gs144000`` (baseline): 144,000 Gaussians, no opacity, 18 raw semantics (empty is an ordinary
  class), scales in [0.08, 0.32] m, steps <= (2, 2, 0.5) m, all 4 layers supervised. ~75.5M.
* ``gs25600_r50``: ``gs25600`` on a plain ResNet-50 without DCN (upstream's base backbone; frozen like the
  R101 here: stem + stage 1, and all BN with ``backbone_weights``), ~36.2M parameters.
* ``test``: a few hundred Gaussians on a 20x20x4 grid of 1 m voxels, ResNet-50 / 16, d=32 (CPU tests).

Backbone: ResNet-101 with DCNv2 (``torchvision.ops.deform_conv2d``) in stages 3-4, as upstream's
R101-DCN; its BatchNorm is frozen as upstream's only with ``backbone_weights`` (from random init it trains:
``norm_eval="with_weights"``, ``drivebench.models.common.backbone``; frozen, BN are buffers and counts ~0.1M
lower); ``depth=resnet50,
dcn_stages=()`` gives the plain R50 of upstream's base config.
Images: 6 x 1600x864 (full resolution, cropped) for the paper sizes. Grid: SurroundOcc's 200x200x16
voxels of 0.5 m over x, y in [-50, 50), z in [-5, 3) m of the lidar frame; 18 classes, 17 = empty.
"""

from __future__ import annotations

from typing import Any

from drivebench.models.gaussianformer.model import GaussianFormer
from drivebench.models.registry import register_model

_NUSCENES_OCC = dict(grid_shape=(200, 200, 16), grid_lower=(-50.0, -50.0, -5.0), voxel_size=0.5, num_classes=18,
                     empty_label=17, image_size=(864, 1600))
_PAPER_BACKBONE = dict(depth="resnet101", dcn_stages=(2, 3), width_div=1, embed_dims=128, ffn_dims=512)

SIZES: dict[str, dict[str, Any]] = {
    "gs25600": dict(
        **_PAPER_BACKBONE, **_NUSCENES_OCC, num_gaussians=25600, scale_range=(0.08, 0.64), unit_xyz=(4.0, 4.0, 1.0),
        include_opacity=True, semantics_activation="softplus", with_empty=True, empty_mean=(0.0, 0.0, -1.0),
        empty_scale=(100.0, 100.0, 8.0), sparse_voxel_size=0.5, sparse_out_proj=True, loss_layers="last",
        aggregation_checkpoint=False,
    ),
    "gs144000": dict(
        **_PAPER_BACKBONE, **_NUSCENES_OCC, num_gaussians=144000, scale_range=(0.08, 0.32), unit_xyz=(2.0, 2.0, 0.5),
        include_opacity=False, semantics_activation="identity", with_empty=False, sparse_voxel_size=0.5,
        sparse_out_proj=False, loss_layers="all", aggregation_checkpoint=True,
    ),
    # the solid config on upstream's base backbone (config/_base_/model.py: plain ResNet-50, no DCN)
    "gs25600_r50": dict(
        **{**_PAPER_BACKBONE, "depth": "resnet50", "dcn_stages": ()}, **_NUSCENES_OCC, num_gaussians=25600,
        scale_range=(0.08, 0.64), unit_xyz=(4.0, 4.0, 1.0), include_opacity=True, semantics_activation="softplus",
        with_empty=True, empty_mean=(0.0, 0.0, -1.0), empty_scale=(100.0, 100.0, 8.0), sparse_voxel_size=0.5,
        sparse_out_proj=True, loss_layers="last", aggregation_checkpoint=False,
    ),
    "test": dict(
        depth="resnet50", dcn_stages=(2, 3), width_div=16, embed_dims=32, ffn_dims=64, num_gaussians=200,
        scale_range=(0.2, 0.6), unit_xyz=(2.0, 2.0, 0.5), include_opacity=True, semantics_activation="softplus",
        with_empty=True, empty_mean=(0.0, 0.0, -1.0), empty_scale=(20.0, 20.0, 4.0), sparse_voxel_size=1.0,
        sparse_out_proj=True, loss_layers="all", grid_shape=(20, 20, 4), grid_lower=(-10.0, -10.0, -2.0),
        voxel_size=1.0, num_classes=18, empty_label=17, image_size=(64, 96),
    ),
}


@register_model(
    "gaussianformer", sizes=SIZES, default_size="gs25600", task="occupancy", dataset="nuscenes-surroundocc",
    img_norm=dict(mean=(123.675, 116.28, 103.53), std=(58.395, 57.12, 57.375), to_rgb=True),
    cameras=("CAM_FRONT", "CAM_FRONT_RIGHT", "CAM_FRONT_LEFT", "CAM_BACK", "CAM_BACK_LEFT", "CAM_BACK_RIGHT"),
)
def build_gaussianformer(**kwargs: Any) -> GaussianFormer:
    """Registry builder: every size entry is a keyword of ``GaussianFormer``."""
    return GaussianFormer(**kwargs)


__all__ = ["GaussianFormer", "SIZES", "build_gaussianformer"]
