"""SparseDrive's initial anchors as k-means clusters of the training infos, as upstream's
``tools/kmeans/kmeans_{det,map,motion,plan}.py`` compute them (once, then cached).

What is clustered (upstream's choices; records sorted by time first, as upstream sorts its infos):
- detection: the centres (x, y, z, LiDAR frame) of every annotated box within 55 m of the LiDAR;
  each anchor is a centre plus log sizes 1, heading 90 degrees and zero velocity;
- map: the mean vertex of every map element of the sample's map geometry; each anchor is a
  straight 8 m segment through its centre along the driving direction (``forward_yaw``);
- motion: per detection class, the 6 s futures (12 steps, all present) of boxes within 55 m, in
  the agent's frame (x along its heading), 6 modes per class;
- planning: per driving command (right, left, straight), the 3 s ego futures (6 steps, all
  present) in the LiDAR frame, 6 modes per command.
Clustering: scikit-learn's ``KMeans`` (k-means++ start, one run, ``random_state=seed``), as upstream
uses scikit-learn. Where fewer distinct points than clusters exist (small sets), every distinct
point is an anchor and the rest keep the built-in defaults (``anchors.py``); the report says how
many. Results are cached under the data cache, keyed by the clustered points themselves, the
cluster counts and the seed.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from drivebench.data.nuscenes.cache import cached
from drivebench.data.nuscenes.infos import DETECTION_CLASSES as INFO_CLASSES, NAME_MAPPING
from drivebench.models.sparsedrive.anchors import (
    default_detection_anchors,
    default_map_anchors,
    default_motion_anchors,
    default_plan_anchors,
)

CACHE_NAME = "sparsedrive-kmeans"
CACHE_VERSION = 1


@dataclass(frozen=True)
class AnchorSpec:
    """What shapes the anchors of one network (``SparseDrive.anchor_spec``)."""

    num_det: int
    num_map: int
    num_map_sample: int
    class_names: tuple[str, ...]
    motion: tuple[int, int, int] | None  # (classes, modes, steps); None without a motion head
    plan: tuple[int, int, int] | None  # (commands, modes, steps)
    forward_yaw: float = math.pi / 2
    map_roi: tuple[float, float] = (30.0, 60.0)
    max_distance: float = 55.0  # upstream DIS_THRESH
    map_length: float = 8.0  # metres of each map anchor segment


def kmeans(points: np.ndarray, k: int, seed: int) -> tuple[np.ndarray, int]:
    """(k' <= k, D) cluster centres of ``points`` and k'; k' < k only when fewer distinct points exist
    (then every distinct point, in sorted order)."""
    points = np.asarray(points, dtype=np.float64)
    distinct = np.unique(points, axis=0) if len(points) else points
    if len(distinct) <= k:
        return distinct, len(distinct)
    from sklearn.cluster import KMeans

    model = KMeans(n_clusters=k, init="k-means++", n_init=1, random_state=seed).fit(points)
    return model.cluster_centers_, k


def _detection_name(inst: Mapping[str, Any]) -> str:
    name = NAME_MAPPING.get(inst.get("category_name", ""))
    if name is None:
        label = inst.get("bbox_label_3d", -1)
        name = INFO_CLASSES[label] if 0 <= label < len(INFO_CLASSES) else ""
    return name


def _sorted(records: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return sorted(records, key=lambda r: (float(r["timestamp"]), str(r["token"])))


def detection_points(records: Sequence[Mapping[str, Any]], max_distance: float) -> np.ndarray:
    """(N, 3) box centres within ``max_distance`` of the LiDAR (every annotated box, as upstream)."""
    centres = [inst["bbox_3d"][:3] for r in records for inst in r["instances"]]
    arr = np.asarray(centres, np.float64).reshape(-1, 3)
    return arr[np.linalg.norm(arr[:, :2], axis=1) < max_distance]


def map_points(records: Sequence[Mapping[str, Any]], geometry: Mapping[str, Sequence[tuple[int, np.ndarray]]]) -> np.ndarray:
    """(N, 2) mean vertex of every map element of the samples (``precompute_map_geometry`` output)."""
    centres = [np.asarray(coords, np.float64)[:, :2].mean(axis=0) for r in records
               for _, coords in geometry.get(r["token"], ())]
    return np.asarray(centres, np.float64).reshape(-1, 2)


def motion_points(records: Sequence[Mapping[str, Any]], class_names: Sequence[str], steps: int,
                  max_distance: float) -> list[np.ndarray]:
    """Per class (M_c, steps * 2): complete agent futures within ``max_distance``, cumulative, in the agent frame."""
    out: list[list[np.ndarray]] = [[] for _ in class_names]
    for r in records:
        for inst in r["instances"]:
            name = _detection_name(inst)
            mask = np.asarray(inst.get("fut_masks", ()), bool)
            if name not in class_names or len(mask) < steps or not mask[:steps].all():
                continue
            x, y, _, _, _, _, yaw = inst["bbox_3d"]
            if math.hypot(x, y) >= max_distance:
                continue
            traj = np.cumsum(np.asarray(inst["fut_trajs"], np.float64)[:steps], axis=0)
            c, s = math.cos(yaw), math.sin(yaw)
            agent = traj @ np.array([[c, -s], [s, c]])  # rotate by -yaw: x along the heading
            out[list(class_names).index(name)].append(agent.reshape(-1))
    return [np.asarray(v, np.float64).reshape(-1, steps * 2) for v in out]


def plan_points(records: Sequence[Mapping[str, Any]], commands: int, steps: int) -> list[np.ndarray]:
    """Per command (M_c, steps * 2): complete ego futures, cumulative, LiDAR frame."""
    out: list[list[np.ndarray]] = [[] for _ in range(commands)]
    for r in records:
        mask = np.asarray(r.get("gt_ego_fut_masks", ()), bool)
        if len(mask) < steps or not mask[:steps].all():
            continue
        traj = np.cumsum(np.asarray(r["gt_ego_fut_trajs"], np.float64)[:steps], axis=0)
        out[int(np.argmax(r["gt_ego_fut_cmd"]))].append(traj.reshape(-1))
    return [np.asarray(v, np.float64).reshape(-1, steps * 2) for v in out]


def _fill(centres: np.ndarray, default: np.ndarray) -> np.ndarray:
    """The clustered rows first, the default's remaining rows after them."""
    return np.concatenate([centres, default[len(centres):]], axis=0) if len(centres) < len(default) else centres


def _fingerprint(*arrays: np.ndarray) -> str:
    digest = hashlib.sha1()
    for a in arrays:
        a = np.ascontiguousarray(a, dtype=np.float64)
        digest.update(str(a.shape).encode())
        digest.update(a.tobytes())
    return digest.hexdigest()


def compute_anchors(records: Sequence[Mapping[str, Any]], map_geometry: Mapping[str, Any] | None, spec: AnchorSpec,
                    seed: int = 0) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Anchors in the network's layouts (``det`` (num_det, 11), ``map`` (num_map, 2 * samples),
    ``motion`` (classes, modes, steps, 2), ``plan`` (commands, modes, steps, 2)) and a report:
    per kind the points clustered and how many anchors are clusters (the rest: defaults)."""
    records = _sorted(records)
    anchors: dict[str, np.ndarray] = {}
    report: dict[str, Any] = {}

    det = detection_points(records, spec.max_distance)
    centres, k = kmeans(det, spec.num_det, seed)
    default = default_detection_anchors(spec.num_det).numpy().astype(np.float64)
    clustered = np.zeros((k, 11))
    clustered[:, :3] = centres
    clustered[:, 3:6] = 1.0  # log sizes, as upstream's data/kmeans files
    clustered[:, 6] = 1.0  # sin(yaw): heading 90 degrees, cos 0, zero velocity
    anchors["det"] = _fill(clustered, default)
    report["det"] = {"points": len(det), "clusters": k, "default": spec.num_det - k}

    default_map = default_map_anchors(spec.num_map, spec.num_map_sample, spec.map_roi, spec.map_length,
                                      spec.forward_yaw).numpy().astype(np.float64)
    pts = map_points(records, map_geometry or {})
    centres, k = kmeans(pts, spec.num_map, seed)
    along = np.linspace(-spec.map_length / 2, spec.map_length / 2, spec.num_map_sample)
    offsets = np.stack([along * math.cos(spec.forward_yaw), along * math.sin(spec.forward_yaw)], axis=-1)
    segments = (centres[:, None] + offsets[None]).reshape(k, 2 * spec.num_map_sample)
    anchors["map"] = _fill(segments, default_map)
    report["map"] = {"points": len(pts), "clusters": k, "default": spec.num_map - k}

    if spec.motion is not None:
        num_cls, modes, steps = spec.motion
        motion = default_motion_anchors(num_cls, modes, steps).numpy().astype(np.float64)
        per_class = motion_points(records, spec.class_names[:num_cls], steps, spec.max_distance)
        report["motion"] = {}
        for c, pts in enumerate(per_class):
            if len(pts) < modes:  # too few futures to cluster: the class keeps its default modes
                report["motion"][spec.class_names[c]] = {"points": len(pts), "clusters": 0, "default": modes}
                continue
            centres, k = kmeans(pts, modes, seed)
            motion[c, :k] = centres.reshape(k, steps, 2)
            report["motion"][spec.class_names[c]] = {"points": len(pts), "clusters": k, "default": modes - k}
        anchors["motion"] = motion
    if spec.plan is not None:
        commands, modes, steps = spec.plan
        plan = default_plan_anchors(modes, steps, forward_yaw=spec.forward_yaw).numpy().astype(np.float64)
        report["plan"] = {}
        for c, pts in enumerate(plan_points(records, commands, steps)):
            name = ("right", "left", "straight")[c] if commands == 3 else str(c)
            if len(pts) < modes:
                report["plan"][name] = {"points": len(pts), "clusters": 0, "default": modes}
                continue
            centres, k = kmeans(pts, modes, seed)
            plan[c, :k] = centres.reshape(k, steps, 2)
            report["plan"][name] = {"points": len(pts), "clusters": k, "default": modes - k}
        anchors["plan"] = plan
    return anchors, report


def kmeans_anchors(records: Sequence[Mapping[str, Any]], map_geometry: Mapping[str, Any] | None, spec: AnchorSpec,
                   seed: int = 0, cache_dir: str | Path | None = None,
                   use_cache: bool = True) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """:func:`compute_anchors`, cached under ``cache_dir`` keyed by what shapes the result: the
    points to cluster (a hash), the anchor spec, the seed and this module's version."""
    ordered = _sorted(records)
    parts = [detection_points(ordered, spec.max_distance), map_points(ordered, map_geometry or {})]
    if spec.motion is not None:
        parts += motion_points(ordered, spec.class_names[:spec.motion[0]], spec.motion[2], spec.max_distance)
    if spec.plan is not None:
        parts += plan_points(ordered, spec.plan[0], spec.plan[2])
    key = {"what": f"{CACHE_NAME}-v{CACHE_VERSION}", "spec": asdict(spec), "seed": seed, "points": _fingerprint(*parts)}
    return cached(cache_dir, CACHE_NAME, key, lambda: compute_anchors(records, map_geometry, spec, seed),
                  use_cache=use_cache)


def as_tensors(anchors: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
    return {k: torch.as_tensor(v, dtype=torch.float32) for k, v in anchors.items()}
