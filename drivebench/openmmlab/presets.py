"""Size presets for mmdet3d configs (``model.size``): mmengine ``--cfg-options`` computed from the
loaded config, applied before the user's ``model.cfg_options``.

Why computed, not fixed: a small PointPillars must keep its grid consistent with the config's point
cloud range and its channel counts consistent between encoder, backbone, neck and head; reading
them from the config makes one preset serve the nuScenes, KITTI, Lyft and Waymo variants.

* ``config``: the config as written.
* ``test`` (CPU tests; called ``tiny`` before, which :data:`DEPRECATED_PRESETS` still maps to it):
  PointPillars with 4x coarser pillars, a quarter of the channels, one block per backbone stage,
  and a 10-iteration LR warm-up (the configs warm up over 1,000 iterations, longer than a bounded
  CPU run). Data and losses are the config's.
"""

from __future__ import annotations

from typing import Any, Callable

from drivebench.errors import ConfigError

PILLAR_SCALE = 4        # test-size pillars are this many times wider (x and y)
CHANNEL_DIVISOR = 4     # test-size layers have this fraction of the channels
TEST_WARMUP_ITERS = 10  # test-size LR warm-up (linear, iteration-based)


def _config(cfg: Any) -> dict[str, Any]:
    return {}


def _quarter(values: list[int]) -> list[int]:
    return [max(8, int(v) // CHANNEL_DIVISOR) for v in values]


def _test(cfg: Any) -> dict[str, Any]:
    model = cfg.model
    p = "pts_" if "pts_voxel_encoder" in model else ""
    mid = model.get(f"{p}middle_encoder") or {}
    if mid.get("type") != "PointPillarsScatter":
        raise ConfigError(f"model.size=test is defined for PointPillars configs (middle encoder PointPillarsScatter); "
                          f"this one has {mid.get('type') or model.get('type')}: use model.size=config and shrink it "
                          "with model.cfg_options")
    enc, bb, neck, head = (model[f"{p}{k}"] for k in ("voxel_encoder", "backbone", "neck", "bbox_head"))
    layer = model.data_preprocessor.voxel_layer
    pcr = list(layer.point_cloud_range)
    voxel = [layer.voxel_size[0] * PILLAR_SCALE, layer.voxel_size[1] * PILLAR_SCALE, layer.voxel_size[2]]
    nx = int(round((pcr[3] - pcr[0]) / voxel[0]))
    ny = int(round((pcr[4] - pcr[1]) / voxel[1]))
    feat = _quarter(enc.feat_channels)
    bb_out = _quarter(bb.out_channels)
    opts: dict[str, Any] = {
        "model.data_preprocessor.voxel_layer.voxel_size": voxel,
        "model.data_preprocessor.voxel_layer.max_num_points": min(int(layer.max_num_points), 32),
        "model.data_preprocessor.voxel_layer.max_voxels": [min(int(v), nx * ny) for v in layer.max_voxels],
        f"model.{p}voxel_encoder.voxel_size": voxel,
        f"model.{p}voxel_encoder.feat_channels": feat,
        f"model.{p}middle_encoder.in_channels": feat[-1],
        f"model.{p}middle_encoder.output_shape": [ny, nx],
        f"model.{p}backbone.in_channels": feat[-1],
        f"model.{p}backbone.out_channels": bb_out,
        f"model.{p}backbone.layer_nums": [1] * len(bb.layer_nums),
        f"model.{p}neck.in_channels": bb_out,
    }
    if isinstance(neck.out_channels, int):  # FPN: one width for every level
        head_in = max(8, neck.out_channels // CHANNEL_DIVISOR)
        opts[f"model.{p}neck.out_channels"] = head_in
    else:  # SECONDFPN: levels concatenated
        neck_out = _quarter(neck.out_channels)
        opts[f"model.{p}neck.out_channels"] = neck_out
        head_in = sum(neck_out)
    opts[f"model.{p}bbox_head.in_channels"] = head_in
    if "feat_channels" in head:
        opts[f"model.{p}bbox_head.feat_channels"] = head_in
    schedulers = [dict(s) for s in cfg.get("param_scheduler") or []]
    if any(s.get("type") == "LinearLR" and not s.get("by_epoch", True) for s in schedulers):
        for s in schedulers:
            if s.get("type") == "LinearLR" and not s.get("by_epoch", True):
                s["end"] = min(int(s.get("end", TEST_WARMUP_ITERS)), TEST_WARMUP_ITERS)
        opts["param_scheduler"] = schedulers
    return opts


PRESETS: dict[str, Callable[[Any], dict[str, Any]]] = {"config": _config, "test": _test}
DEPRECATED_PRESETS = {"tiny": "test"}  # old size name -> current (the model registry warns once)
