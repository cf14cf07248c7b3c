"""Per-sample tensors with the batch contract's names, and the collate that batches them.

Fixed-size keys are stacked; per-sample ground truth of varying length stays a list of tensors;
``gt_depth`` is a list over levels of (B, N, H_l, W_l). When image work is left for the device,
the images travel as ``img_uint8`` (B, N, 3, H, W) or ``img_jpeg`` (B lists of N byte tensors) with
``photometric_params`` (B, N, 13) and, for a device-side warp, ``img_aug_matrix`` (B, N, 3, 3).
"""

from __future__ import annotations

import numpy as np
import torch

STACKED = ("img", "img_uint8", "img_shape", "lidar2img", "cam_intrinsic", "cam2lidar", "lidar2ego", "ego2global",
           "can_bus", "timestamp", "sequence_id", "frame_idx", "prev_exists", "gt_ego_fut_trajs",
           "gt_ego_fut_masks", "gt_ego_fut_cmd", "ego_status", "occ_label", "occ_mask", "photometric_params",
           "img_aug_matrix")
LISTED = ("gt_map_labels", "gt_map_pts", "gt_map_num_orderings", "gt_boxes_3d", "gt_labels_3d", "gt_instance_ids",
          "gt_attr_labels", "gt_velocity_valid", "gt_agent_fut_trajs", "gt_agent_fut_masks", "img_jpeg")
FLOAT_KEYS = ("lidar2img", "cam_intrinsic", "cam2lidar", "lidar2ego", "ego2global", "can_bus", "gt_ego_fut_trajs",
              "gt_ego_fut_cmd", "ego_status", "photometric_params", "img_aug_matrix", "gt_map_pts", "gt_boxes_3d",
              "gt_agent_fut_trajs")
LONG_KEYS = ("img_shape", "sequence_id", "frame_idx", "occ_label", "gt_map_labels", "gt_map_num_orderings",
             "gt_labels_3d", "gt_instance_ids", "gt_attr_labels")
BOOL_KEYS = ("prev_exists", "gt_ego_fut_masks", "occ_mask", "gt_agent_fut_masks", "gt_velocity_valid")


class FormatCameraSample:
    """results -> {contract key: tensor}. Images: float (normalised) -> ``img``; uint8 ->
    ``img_uint8`` + ``photometric_params``; JPEG bytes -> ``img_jpeg`` + ``photometric_params``.
    ``device_warp`` also ships ``img_aug_matrix`` (the device redoes resize/crop/flip/rotate)."""

    def __init__(self, device_warp: bool = False) -> None:
        self.device_warp = device_warp

    def __call__(self, results: dict) -> dict:
        out: dict = {}
        if "img_jpeg" in results:
            out["img_jpeg"] = [torch.from_numpy(np.asarray(b)) for b in results["img_jpeg"]]
            out["photometric_params"] = results.get("photometric_params", np.zeros((len(results["img_jpeg"]), 13)))
        else:
            views = results["img"]
            shapes = {v.shape for v in views}
            if len(shapes) > 1:
                raise ValueError(f"views of one sample differ in size {sorted(shapes)}; pad or crop them to one size")
            h, w = views[0].shape[:2]
            chw_np = np.empty((len(views), 3, h, w), views[0].dtype)  # one copy: HWC -> CHW per view
            for i, v in enumerate(views):
                chw_np[i] = v.transpose(2, 0, 1)
            chw = torch.from_numpy(chw_np)
            if chw_np.dtype == np.uint8:
                out["img_uint8"] = chw
                out["photometric_params"] = results.get("photometric_params", np.zeros((len(views), 13)))
            else:
                out["img"] = chw.float()
        if self.device_warp:
            out["img_aug_matrix"] = results["img_aug_matrix"]
        out["img_shape"] = np.asarray(results["img_shape"], np.int64)
        out["lidar2img"] = results["lidar2img"]
        out["cam_intrinsic"] = results["cam_intrinsic"]
        out["cam2lidar"] = results["cam2lidar"]
        out["lidar2ego"] = results["lidar2ego"]
        out["ego2global"] = results["ego2global"]
        out["can_bus"] = results["can_bus"]
        out["timestamp"] = torch.tensor(results["timestamp"], dtype=torch.float64)
        out["sequence_id"] = results["sequence_id"]
        out["frame_idx"] = results["frame_idx"]
        out["prev_exists"] = bool(results.get("prev_exists", False))
        for key in ("gt_map_labels", "gt_map_pts", "gt_map_num_orderings", "gt_boxes_3d", "gt_labels_3d",
                    "gt_instance_ids", "gt_attr_labels", "gt_velocity_valid", "gt_agent_fut_trajs", "gt_agent_fut_masks", "gt_ego_fut_trajs",
                    "gt_ego_fut_masks", "gt_ego_fut_cmd", "ego_status", "occ_label", "occ_mask"):
            if key in results:
                out[key] = results[key]
        if "gt_depth" in results:
            out["gt_depth"] = [torch.from_numpy(np.asarray(d, np.float32)) for d in results["gt_depth"]]
        return {k: _tensor(k, v) for k, v in out.items()}


def _tensor(key: str, v):
    if isinstance(v, (list, tuple)) and key in ("img_jpeg", "gt_depth"):
        return v
    if isinstance(v, torch.Tensor):
        t = v
    else:
        t = torch.as_tensor(np.asarray(v))
    if key in FLOAT_KEYS:
        return t.float()
    if key in LONG_KEYS:
        return t.long()
    if key in BOOL_KEYS:
        return t.bool()
    return t


def collate(samples: list[dict]) -> dict:
    """Stack fixed-size keys, keep per-sample ground truth as lists, ``gt_depth`` per level."""
    if not samples:
        raise ValueError("collate got an empty batch")
    keys = samples[0].keys()
    batch: dict = {}
    for key in keys:
        vals = [s[key] for s in samples]
        if key == "gt_depth":
            batch[key] = [torch.stack([v[lvl] for v in vals]) for lvl in range(len(vals[0]))]
        elif key in LISTED:
            batch[key] = vals
        elif key in STACKED:
            shapes = {tuple(v.shape) for v in vals}
            if len(shapes) > 1:
                raise ValueError(f"cannot stack {key!r}: samples have shapes {sorted(shapes)}; pad images to one size "
                                 "(PadMultiView) or use one final_dim")
            batch[key] = torch.stack(vals)
        else:
            raise KeyError(f"collate does not know key {key!r}; add it to collate.STACKED or collate.LISTED")
    return batch
