"""Detection, motion and planning targets in the batch contract's layout (SparseDrive's filters)."""

from __future__ import annotations

import numpy as np

from drivebench.data.nuscenes import ATTRIBUTE_NAMES

# the batch contract's detection classes (SparseDrive's class_names order)
CONTRACT_CLASSES = ("car", "truck", "construction_vehicle", "bus", "trailer", "barrier", "motorcycle", "bicycle",
                    "pedestrian", "traffic_cone")


class BoxTargets:
    """Boxes -> ``gt_boxes_3d`` (n, 9): x, y, z (centre), w, l, h, yaw, vx, vy in the LiDAR frame,
    ``gt_labels_3d``, ``gt_instance_ids``, ``gt_agent_fut_trajs`` (n, 12, 2; offsets from the
    current centre, cumulative) and ``gt_agent_fut_masks``; for the nuScenes metrics
    ``gt_attr_labels`` (index into ``ATTRIBUTE_NAMES``, -1 none) and ``gt_velocity_valid`` (the
    annotation's velocity could be estimated; it is 0 in ``gt_boxes_3d`` where not, as upstream).

    Kept: known classes, centre within ``max_distance`` (CircleObjectRangeFilter, 55 m) and, as
    Sparse4D's dataset, boxes with LiDAR points (``valid_flag`` when ``use_valid_flag``).
    """

    def __init__(self, classes=CONTRACT_CLASSES, max_distance: float = 55.0, use_valid_flag: bool = False) -> None:
        self.classes = tuple(classes)
        self.max_distance = max_distance
        self.use_valid_flag = use_valid_flag

    def __call__(self, results: dict) -> dict:
        names = results["gt_names"]
        boxes = results["gt_bboxes"]  # (n, 7) mmdet3d: x, y, z, l, w, h, yaw
        keep = np.array([n in self.classes for n in names], bool)
        keep &= np.linalg.norm(boxes[:, :2], axis=1) <= self.max_distance
        keep &= results["valid_flag"] if self.use_valid_flag else results["num_lidar_pts"] > 0
        b = boxes[keep]
        velo_raw = results["gt_velocity"][keep]
        velo = np.nan_to_num(velo_raw, nan=0.0)
        yaw = b[:, 6] - np.floor(b[:, 6] / (2 * np.pi) + 0.5) * 2 * np.pi
        out = np.concatenate([b[:, :3], b[:, 4:5], b[:, 3:4], b[:, 5:6], yaw[:, None], velo], axis=1)
        results["gt_boxes_3d"] = out.astype(np.float32)
        results["gt_labels_3d"] = np.array([self.classes.index(n) for n in names[keep]], np.int64)
        results["gt_instance_ids"] = results["instance_ids"][keep].astype(np.int64)
        attr_names = results.get("gt_attribute_names", np.full(len(names), "", dtype=object))[keep]
        results["gt_attr_labels"] = np.array([ATTRIBUTE_NAMES.index(a) if a in ATTRIBUTE_NAMES else -1
                                              for a in attr_names], np.int64)
        results["gt_velocity_valid"] = ~np.isnan(velo_raw).any(axis=1)
        results["gt_agent_fut_trajs"] = np.cumsum(results["agent_fut_trajs"][keep], axis=1).astype(np.float32)
        results["gt_agent_fut_masks"] = results["agent_fut_masks"][keep].astype(bool)
        return results


class EgoTargets:
    """Ego future positions (cumulative, LiDAR frame), their mask, the one-hot command, ego status."""

    def __call__(self, results: dict) -> dict:
        results["gt_ego_fut_trajs"] = np.cumsum(np.asarray(results["ego_fut_steps"], np.float32), axis=0)
        results["gt_ego_fut_masks"] = np.asarray(results["ego_fut_masks"]).astype(bool)
        results["gt_ego_fut_cmd"] = np.asarray(results["ego_fut_cmd"], np.float32)
        results["ego_status"] = np.asarray(results["ego_status_raw"], np.float32)
        return results
