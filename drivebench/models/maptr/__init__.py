"""MapTR v1 (hustvl/MapTR ``main``), registered as ``maptr`` with sizes tiny / nano / test.

Sizes (keyword arguments of ``MapTR``):
- ``tiny``: upstream ``maptr_tiny_r50_24e`` (R50, BEV 200x100, 6 decoder layers, 50 instances); its
  BatchNorm is frozen, as upstream's, only with ``backbone_weights`` (``norm_eval="with_weights"``:
  frozen statistics of random weights are the identity, ``drivebench.models.common.backbone``).
- ``nano``: upstream ``maptr_nano_r18_110e`` (R18 with trainable BN, BEV 80x40, 100 instances,
  2 decoder layers with 4 heads).
- ``test``: a shrunk R18 and d=32 for CPU tests (forward + backward well under a second).

The registry entry's ``inputs`` metadata gives each size's input contract: image size after the
pipeline (resize of the 1600x900 nuScenes images, then padding to a multiple of 32), normalisation,
BEV grid and range, number of cameras and map points.
"""

from __future__ import annotations

from typing import Any

from drivebench.models.maptr.model import MAP_CLASSES, MapTR
from drivebench.models.registry import register_model

PC_RANGE = (-15.0, -30.0, -2.0, 15.0, 30.0, 2.0)
IMG_NORM = {"mean": (123.675, 116.28, 103.53), "std": (58.395, 57.12, 57.375), "to_rgb": True}

SIZES: dict[str, dict[str, Any]] = {
    "tiny": {
        "backbone": "resnet50", "frozen_stages": 1, "norm_eval": "with_weights", "embed_dims": 256,
        "bev_hw": (200, 100), "pc_range": PC_RANGE, "encoder_ffn": 512, "tsa_heads": 8,
        "decoder_layers": 6, "decoder_heads": 8, "decoder_deform_heads": 8, "decoder_ffn": 512, "num_vec": 50,
        "num_pts": 20, "grid_mask": True,
    },
    "nano": {
        "backbone": "resnet18", "frozen_stages": -1, "norm_eval": False, "embed_dims": 256,
        "bev_hw": (80, 40), "pc_range": PC_RANGE, "encoder_ffn": 512, "tsa_heads": 8,
        "decoder_layers": 2, "decoder_heads": 4, "decoder_deform_heads": 8, "decoder_ffn": 512, "num_vec": 100,
        "num_pts": 20, "grid_mask": True,
    },
    "test": {
        "backbone": "resnet18", "width_div": 8, "frozen_stages": 1, "norm_eval": "with_weights", "embed_dims": 32,
        "bev_hw": (20, 10), "pc_range": PC_RANGE, "encoder_ffn": 64, "tsa_heads": 4,
        "decoder_layers": 2, "decoder_heads": 4, "decoder_deform_heads": 4, "decoder_ffn": 64, "num_vec": 6,
        "num_pts": 20, "grid_mask": False,
    },
}


def _input_contract(image_hw: tuple[int, int], valid_hw: tuple[int, int], scale: float | None,
                    bev_hw: tuple[int, int]) -> dict[str, Any]:
    return {
        "source_hw": (900, 1600), "resize_scale": scale, "valid_hw": valid_hw, "image_hw": image_hw,
        "pad_divisor": 32, "img_norm": IMG_NORM, "num_cams": 6, "bev_hw": bev_hw, "pc_range": PC_RANGE,
        "num_map_pts": 20, "map_classes": MAP_CLASSES,
    }


INPUTS = {
    # 1600x900 * 0.5 = 800x450, padded to 800x480
    "tiny": _input_contract((480, 800), (450, 800), 0.5, (200, 100)),
    # upstream nano resizes by 0.2: 320x180, padded to 320x192
    "nano": _input_contract((192, 320), (180, 320), 0.2, (80, 40)),
    "test": _input_contract((64, 96), (54, 96), 0.06, (20, 10)),
}


@register_model("maptr", sizes=SIZES, default_size="tiny", inputs=INPUTS,
                paper="MapTR (Liao et al., ICLR 2023)", upstream="hustvl/MapTR@main (v1)")
def build_maptr(**kwargs: Any) -> MapTR:
    """Build MapTR from a size's keyword arguments (plus overrides)."""
    return MapTR(**kwargs)


__all__ = ["INPUTS", "MAP_CLASSES", "MapTR", "SIZES", "build_maptr"]
