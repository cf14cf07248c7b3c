"""The sample index: one record per key frame, built once with the official devkit and cached.

Records carry the fields of mmdetection3d v1.x nuScenes info files (``data_list`` entries with
``images``, ``lidar_points``, ``lidar_sweeps``, ``instances``...) plus what the camera models need
beyond them (scene and sequence ids, prev/next, the MapTR CAN bus vector, SparseDrive's agent and
ego futures, driving command and ego status, the occupancy label path). README.md in this folder
maps every field. With a real nuScenes root nothing here is specific to the embedded set.

Bad data: a missing table stops the load (``MissingTableError``); a missing or corrupt image,
point or map file is reported with the file and the sample token. ``on_corrupt="skip"`` drops those
samples and counts them (``InfoIndex.skipped``).
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import numpy as np
from pyquaternion import Quaternion

from drivebench.accel.threads import pool_kwargs
from drivebench.data.nuscenes import CAMERAS, LOCATIONS
from drivebench.data.nuscenes.cache import cached, file_fingerprint
from drivebench.data.nuscenes.errors import CorruptFileError, DataFileError, MissingFileError, MissingTableError
from drivebench.errors import load_json

CONVERTER_VERSION = 3  # 2: rotations through pyquaternion, as the devkit (poses move by <= 1.2e-13); 3: attribute_name
INFO_VERSION = "1.1"  # mmdet3d's data_list format version
TABLES = ("attribute", "calibrated_sensor", "category", "ego_pose", "instance", "log", "map", "sample",
          "sample_annotation", "sample_data", "scene", "sensor", "visibility")
DETECTION_CLASSES = ("car", "truck", "trailer", "bus", "construction_vehicle", "bicycle", "motorcycle",
                     "pedestrian", "traffic_cone", "barrier")  # mmdet3d's order: bbox_label_3d indexes this
NAME_MAPPING = {
    "movable_object.barrier": "barrier", "vehicle.bicycle": "bicycle", "vehicle.bus.bendy": "bus",
    "vehicle.bus.rigid": "bus", "vehicle.car": "car", "vehicle.construction": "construction_vehicle",
    "vehicle.motorcycle": "motorcycle", "human.pedestrian.adult": "pedestrian",
    "human.pedestrian.child": "pedestrian", "human.pedestrian.construction_worker": "pedestrian",
    "human.pedestrian.police_officer": "pedestrian", "movable_object.trafficcone": "traffic_cone",
    "vehicle.trailer": "trailer", "vehicle.truck": "truck",
}
AGENT_FUTURE_STEPS = 12  # 6 s at 2 Hz (SparseDrive fut_ts)
EGO_FUTURE_STEPS = 6  # 3 s at 2 Hz (SparseDrive ego_fut_ts)
CAN_BUS_BLACKLIST = {161, 162, 163, 164, 165, 166, 167, 168, 170, 171, 172, 173, 174, 175, 176, 309, 310, 311, 312,
                     313, 314}
ON_CORRUPT = ("fail", "skip")
VERIFY = ("exists", "header", "decode")


@dataclass(frozen=True)
class Problem:
    """A sample that cannot be used as is: which file and why."""

    sample_token: str
    path: str
    kind: str  # missing_file | corrupt_file | missing_map

    def error(self) -> DataFileError:
        if self.kind == "corrupt_file":
            return CorruptFileError(self.path, self.sample_token, "corrupt file")
        if self.kind == "missing_map":
            return MissingFileError(self.path, self.sample_token, "map expansion")
        return MissingFileError(self.path, self.sample_token, "data")


@dataclass
class InfoIndex:
    """Records of the usable samples, the dataset's metainfo and what was skipped."""

    records: list[dict]
    metainfo: dict
    problems: list[Problem] = field(default_factory=list)
    skipped: Counter = field(default_factory=Counter)

    def split(self, name: str) -> list[dict]:
        return [r for r in self.records if r["split"] == name]

    def __len__(self) -> int:
        return len(self.records)


# ----------------------------------------------------------------------------------------------
# Small geometry helpers (quaternions are [w, x, y, z] as in the tables; pyquaternion, as the devkit).


def pose_matrix(rotation: Iterable[float], translation: Iterable[float]) -> np.ndarray:
    m = np.eye(4)
    m[:3, :3] = Quaternion(list(rotation)).rotation_matrix
    m[:3, 3] = list(translation)
    return m


def quat_yaw(q: Iterable[float]) -> float:
    """Yaw of a rotation, as ``nuscenes.eval.common.utils.quaternion_yaw`` computes it."""
    v = Quaternion(list(q)).rotation_matrix @ np.array([1.0, 0.0, 0.0])
    return float(math.atan2(v[1], v[0]))


# ----------------------------------------------------------------------------------------------
# File checks.


def check_jpeg(path: Path, verify: str) -> str | None:
    """None when fine, else 'missing_file' or 'corrupt_file'."""
    try:
        size = path.stat().st_size
    except OSError:
        return "missing_file"
    if verify == "exists":
        return None
    if size < 4:
        return "corrupt_file"
    with open(path, "rb") as fh:
        head = fh.read(2)
        fh.seek(-2, os.SEEK_END)
        tail = fh.read(2)
    if head != b"\xff\xd8" or tail != b"\xff\xd9":
        return "corrupt_file"
    if verify == "decode":
        import cv2

        if cv2.imread(str(path), cv2.IMREAD_COLOR) is None:
            return "corrupt_file"
    return None


def check_points(path: Path, verify: str) -> str | None:
    try:
        size = path.stat().st_size
    except OSError:
        return "missing_file"
    if verify != "exists" and (size == 0 or size % 20):
        return "corrupt_file"
    return None


def _bad_table(table_dir: Path, err: ValueError) -> Exception:
    """The table the devkit failed on, named: each is parsed again until one fails (on the error path only)."""
    import json

    from drivebench.errors import json_reason

    for table in sorted(table_dir.glob("*.json")):
        try:
            with open(table, "rb") as handle:
                json.load(handle)
        except ValueError as bad:
            return CorruptFileError(str(table), "", f"nuScenes table is not valid JSON ({json_reason(bad)})")
    return err


# ----------------------------------------------------------------------------------------------
# Per-scene conversion (runs in workers; the devkit object is inherited through fork).

_NUSC: dict[str, Any] = {}


def _load_devkit(root: str, version: str) -> None:
    from nuscenes.nuscenes import NuScenes

    try:
        _NUSC["nusc"] = NuScenes(version=version, dataroot=root, verbose=False)
    except ValueError as err:  # a JSONDecodeError from one of the tables: the devkit does not say which
        raise _bad_table(Path(root) / version, err) from None
    can_dir = Path(root) / "can_bus"
    if can_dir.is_dir():
        from nuscenes.can_bus.can_bus_api import NuScenesCanBus

        _NUSC["can"] = NuScenesCanBus(dataroot=root)
    else:
        _NUSC["can"] = None


def _init_worker(root: str, version: str) -> None:
    if "nusc" not in _NUSC:  # spawn: each worker loads the tables itself
        _load_devkit(root, version)


def _can_messages(scene_name: str) -> tuple[list[dict], list[dict]]:
    can = _NUSC.get("can")
    if can is None or int(scene_name[-4:]) in CAN_BUS_BLACKLIST:
        return [], []
    try:
        return can.get_messages(scene_name, "pose"), can.get_messages(scene_name, "steeranglefeedback")
    except (OSError, ValueError, AssertionError, Exception):  # the devkit raises bare Exception for gaps
        return [], []


def _nearest(utimes: np.ndarray, t: int) -> int:
    """SparseDrive's ``locate_message``: the message closest in time."""
    i = int(np.searchsorted(utimes, t))
    if i == len(utimes) or (i > 0 and t - utimes[i - 1] < utimes[i] - t):
        i -= 1
    return i


def can_bus_vector(pose_msgs: list[dict], timestamp: int, ego_rotation: list[float],
                   ego_translation: list[float]) -> list[float]:
    """MapTR/BEVFormer's 18-vector: translation, rotation, accel, rotation rate, velocity, patch angle.

    Upstream takes the last pose message not after the key frame (its converter then reads accel,
    rotation rate and velocity from the message after it, an off-by-one; here all come from the
    same message), and its dataset overwrites translation and rotation with the ego pose.
    """
    v = np.zeros(18)
    if pose_msgs:
        last = pose_msgs[0]
        for msg in pose_msgs:
            if msg["utime"] > timestamp:
                break
            last = msg
        v[7:10] = last["accel"]
        v[10:13] = last["rotation_rate"]
        v[13:16] = last["vel"]
    v[:3] = ego_translation
    v[3:7] = ego_rotation
    angle = quat_yaw(ego_rotation) / math.pi * 180
    if angle < 0:
        angle += 360
    v[16] = angle / 180 * math.pi
    v[17] = angle
    return v.tolist()


def ego_status(pose_msgs: list[dict], steer_msgs: list[dict], timestamp: int) -> list[float]:
    """SparseDrive's 10-vector: accel (3), rotation rate (3), velocity (3), steering (1)."""
    if not pose_msgs or not steer_msgs:
        return [0.0] * 10
    pose = pose_msgs[_nearest(np.array([m["utime"] for m in pose_msgs]), timestamp)]
    steer = steer_msgs[_nearest(np.array([m["utime"] for m in steer_msgs]), timestamp)]
    return [*map(float, pose["accel"]), *map(float, pose["rotation_rate"]), *map(float, pose["vel"]),
            float(steer["value"])]


def _scene_records(args: tuple[str, int, dict]) -> tuple[list[dict], list[Problem]]:
    scene_token, sequence_id, opts = args
    nusc = _NUSC["nusc"]
    root = Path(nusc.dataroot)
    scene = nusc.get("scene", scene_token)
    log = nusc.get("log", scene["log_token"])
    location = log["location"]
    map_file = root / "maps" / "expansion" / f"{location}.json"
    pose_msgs, steer_msgs = _can_messages(scene["name"])
    records: list[dict] = []
    problems: list[Problem] = []
    tokens = []
    tok = scene["first_sample_token"]
    while tok:
        tokens.append(tok)
        tok = nusc.get("sample", tok)["next"]
    for frame_idx, sample_token in enumerate(tokens):
        sample = nusc.get("sample", sample_token)
        rec, probs = _sample_record(nusc, sample, scene, location, sequence_id, frame_idx, pose_msgs, steer_msgs, opts)
        if not map_file.exists():
            probs.append(Problem(sample_token, str(map_file), "missing_map"))
        records.append(rec)
        problems.extend(probs)
    return records, problems


def _sample_record(nusc, sample: dict, scene: dict, location: str, sequence_id: int, frame_idx: int,
                   pose_msgs: list[dict], steer_msgs: list[dict], opts: dict) -> tuple[dict, list[Problem]]:
    root = Path(nusc.dataroot)
    problems: list[Problem] = []
    lidar_sd = nusc.get("sample_data", sample["data"]["LIDAR_TOP"])
    lidar_cs = nusc.get("calibrated_sensor", lidar_sd["calibrated_sensor_token"])
    lidar_pose = nusc.get("ego_pose", lidar_sd["ego_pose_token"])
    lidar2ego = pose_matrix(lidar_cs["rotation"], lidar_cs["translation"])
    ego2global = pose_matrix(lidar_pose["rotation"], lidar_pose["translation"])
    lidar2global = ego2global @ lidar2ego
    global2lidar = np.linalg.inv(lidar2global)
    kind = check_points(root / lidar_sd["filename"], opts["verify"])
    if kind:
        problems.append(Problem(sample["token"], str(root / lidar_sd["filename"]), kind))

    images = {}
    for cam in CAMERAS:
        sd = nusc.get("sample_data", sample["data"][cam])
        cs = nusc.get("calibrated_sensor", sd["calibrated_sensor_token"])
        pose = nusc.get("ego_pose", sd["ego_pose_token"])
        cam2ego = pose_matrix(cs["rotation"], cs["translation"])
        cam2lidar = global2lidar @ pose_matrix(pose["rotation"], pose["translation"]) @ cam2ego
        images[cam] = {
            "img_path": sd["filename"], "height": sd["height"], "width": sd["width"],
            "cam2img": np.asarray(cs["camera_intrinsic"], float).tolist(), "cam2ego": cam2ego.tolist(),
            "lidar2cam": np.linalg.inv(cam2lidar).tolist(), "sample_data_token": sd["token"],
            "timestamp": sd["timestamp"] / 1e6,
        }
        kind = check_jpeg(root / sd["filename"], opts["verify"])
        if kind:
            problems.append(Problem(sample["token"], str(root / sd["filename"]), kind))

    sweeps = []
    sd = lidar_sd
    while len(sweeps) < opts["max_sweeps"] and sd["prev"]:
        sd = nusc.get("sample_data", sd["prev"])
        cs = nusc.get("calibrated_sensor", sd["calibrated_sensor_token"])
        pose = nusc.get("ego_pose", sd["ego_pose_token"])
        sweep2ego = pose_matrix(cs["rotation"], cs["translation"])
        sweep_e2g = pose_matrix(pose["rotation"], pose["translation"])
        sweep2lidar = global2lidar @ sweep_e2g @ sweep2ego
        sweeps.append({
            "lidar_points": {"lidar_path": sd["filename"], "lidar2ego": sweep2ego.tolist(),
                             "lidar2sensor": np.linalg.inv(sweep2lidar).tolist()},
            "ego2global": sweep_e2g.tolist(), "timestamp": sd["timestamp"] / 1e6, "sample_data_token": sd["token"],
        })

    instances = [_instance(nusc, ann_tok, sample, global2lidar, lidar2global) for ann_tok in sample["anns"]]
    ego_fut, ego_mask, command = _ego_future(nusc, sample, global2lidar)
    occ_root = Path(opts["occ_root"]) if opts["occ_root"] else root / "occupancy"
    occ_file = occ_root / (Path(lidar_sd["filename"]).name + ".npy")
    record = {
        # mmdetection3d v1.x fields
        "sample_idx": -1,
        "token": sample["token"],
        "timestamp": sample["timestamp"] / 1e6,
        "ego2global": ego2global.tolist(),
        "images": images,
        "lidar_points": {"num_pts_feats": 5, "lidar_path": lidar_sd["filename"], "lidar2ego": lidar2ego.tolist()},
        "lidar_sweeps": sweeps,
        "instances": instances,
        # drivebench extensions
        "scene_token": scene["token"],
        "scene_name": scene["name"],
        "sequence_id": sequence_id,
        "frame_idx": frame_idx,
        "prev": sample["prev"],
        "next": sample["next"],
        "split": opts["split_of"].get(scene["name"], "val"),
        "map_location": location,
        "can_bus": can_bus_vector(pose_msgs, sample["timestamp"], lidar_pose["rotation"], lidar_pose["translation"]),
        "ego_status": ego_status(pose_msgs, steer_msgs, sample["timestamp"]),
        "gt_ego_fut_trajs": ego_fut,
        "gt_ego_fut_masks": ego_mask,
        "gt_ego_fut_cmd": command,
        "occ_path": _rel(occ_file, root) if occ_file.exists() else "",
    }
    return record, problems


def _rel(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


def _instance(nusc, ann_tok: str, sample: dict, global2lidar: np.ndarray, lidar2global: np.ndarray) -> dict:
    ann = nusc.get("sample_annotation", ann_tok)
    centre = global2lidar[:3, :3] @ np.asarray(ann["translation"]) + global2lidar[:3, 3]
    rot = global2lidar[:3, :3] @ Quaternion(ann["rotation"]).rotation_matrix
    yaw = float(math.atan2(rot[1, 0], rot[0, 0]))
    w, l, h = ann["size"]
    velo = nusc.box_velocity(ann_tok)[:2]  # NaN when it cannot be estimated, kept as mmdet3d does
    v3 = global2lidar[:3, :3] @ np.array([velo[0], velo[1], 0.0])
    name = NAME_MAPPING.get(ann["category_name"], ann["category_name"])
    label = DETECTION_CLASSES.index(name) if name in DETECTION_CLASSES else -1
    fut, mask = _agent_future(nusc, ann, sample, global2lidar, centre)
    attrs = ann["attribute_tokens"]
    if len(attrs) > 1:
        raise ValueError(f"sample_annotation {ann_tok} has {len(attrs)} attributes; nuScenes allows at most one")
    attribute = nusc.get("attribute", attrs[0])["name"] if attrs else ""
    return {
        # mmdet3d v1.x: gravity centre, (l, w, h) = sizes along the box's x, y, z, yaw in the LiDAR frame
        "bbox_3d": [float(centre[0]), float(centre[1]), float(centre[2]), float(l), float(w), float(h), yaw],
        "bbox_label": label,
        "bbox_label_3d": label,
        "bbox_3d_isvalid": bool(ann["num_lidar_pts"] + ann["num_radar_pts"] > 0),
        "velocity": [float(v3[0]), float(v3[1])],
        "num_lidar_pts": int(ann["num_lidar_pts"]),
        "num_radar_pts": int(ann["num_radar_pts"]),
        # drivebench extensions
        "instance_token": ann["instance_token"],
        "instance_id": int(nusc.getind("instance", ann["instance_token"])),
        "category_name": ann["category_name"],
        "attribute_name": attribute,
        "fut_trajs": fut,
        "fut_masks": mask,
    }


def _agent_future(nusc, ann: dict, sample: dict, global2lidar: np.ndarray, centre: np.ndarray):
    """SparseDrive's agent futures: per-step offsets (first from the current centre) in the LiDAR
    frame over up to 12 following annotations within 6 s."""
    fut = np.zeros((AGENT_FUTURE_STEPS, 2))
    mask = np.zeros(AGENT_FUTURE_STEPS)
    t0 = sample["timestamp"]
    prev_xy = centre[:2]
    nxt = ann["next"]
    for i in range(AGENT_FUTURE_STEPS):
        if not nxt:
            break
        a = nusc.get("sample_annotation", nxt)
        t = nusc.get("sample", a["sample_token"])["timestamp"]
        if (t - t0) * 1e-6 > AGENT_FUTURE_STEPS / 2 + 0.25:
            break
        p = global2lidar[:3, :3] @ np.asarray(a["translation"]) + global2lidar[:3, 3]
        fut[i] = p[:2] - prev_xy
        mask[i] = 1
        prev_xy = p[:2]
        nxt = a["next"]
    return fut.tolist(), mask.tolist()


def _ego_future(nusc, sample: dict, global2lidar: np.ndarray):
    """SparseDrive's ego future: LiDAR positions of the next 6 key frames in this LiDAR frame as
    per-step offsets, their mask, and the command from the last position (x is right in this
    frame: >= 2 m right turn, <= -2 m left turn, else straight)."""
    pos = np.zeros((EGO_FUTURE_STEPS + 1, 3))
    mask = np.zeros(EGO_FUTURE_STEPS + 1)
    cur = sample
    for i in range(EGO_FUTURE_STEPS + 1):
        sd = nusc.get("sample_data", cur["data"]["LIDAR_TOP"])
        cs = nusc.get("calibrated_sensor", sd["calibrated_sensor_token"])
        pose = nusc.get("ego_pose", sd["ego_pose_token"])
        l2g = pose_matrix(pose["rotation"], pose["translation"]) @ pose_matrix(cs["rotation"], cs["translation"])
        pos[i] = (global2lidar @ l2g)[:3, 3]
        mask[i] = 1
        if not cur["next"]:
            pos[i + 1:] = pos[i]
            break
        cur = nusc.get("sample", cur["next"])
    if pos[-1][0] >= 2:
        command = [1.0, 0.0, 0.0]  # turn right
    elif pos[-1][0] <= -2:
        command = [0.0, 1.0, 0.0]  # turn left
    else:
        command = [0.0, 0.0, 1.0]  # go straight
    steps = pos[1:, :2] - pos[:-1, :2]
    return steps.tolist(), mask[1:].tolist(), command


# ----------------------------------------------------------------------------------------------


def detect_version(root: Path) -> str:
    found = [v for v in ("v1.0-trainval", "v1.0-mini", "v1.0-test") if (root / v).is_dir()]
    if len(found) != 1:
        raise DataFileError(str(root), "", f"cannot tell the nuScenes version (found {found or 'none'})",
                            "pass version=... explicitly")
    return found[0]


def check_tables(root: Path, version: str) -> None:
    for name in TABLES:
        path = root / version / f"{name}.json"
        if not path.exists():
            raise MissingTableError(str(path))


def check_map_masks(root: Path, version: str) -> None:
    import json

    for rec in load_json(root / version / "map.json"):
        path = root / rec["filename"]
        if not path.exists():
            raise MissingFileError(str(path), "", "map mask (the map table's PNG)")


def split_of(version: str) -> dict[str, str]:
    from drivebench.data.nuscenes.generate import official_splits

    s = official_splits()
    if version == "v1.0-mini":
        pairs = (("train", s["mini_train"]), ("val", s["mini_val"]))
    elif version == "v1.0-test":
        pairs = (("test", s["test"]),)
    else:
        pairs = (("train", s["train"]), ("val", s["val"]))
    return {name: split for split, names in pairs for name in names}


def build_infos(
    root: Path | str,
    version: str | None = None,
    *,
    workers: int = 0,
    max_sweeps: int = 10,
    on_corrupt: str = "fail",
    verify: str = "header",
    occ_root: Path | str | None = None,
    cache_dir: Path | str | None = None,
    use_cache: bool = True,
) -> InfoIndex:
    """Index every key frame of a nuScenes root (real or embedded) with the devkit; cached on disk.

    ``verify``: how hard to check data files (exists | header: JPEG SOI/EOI markers and point-file
    size | decode: full JPEG decode). ``on_corrupt``: fail (raise on the first bad sample) or skip.
    """
    if on_corrupt not in ON_CORRUPT:
        raise ValueError(f"on_corrupt={on_corrupt!r} is not valid; choose one of: {', '.join(ON_CORRUPT)}")
    if verify not in VERIFY:
        raise ValueError(f"verify={verify!r} is not valid; choose one of: {', '.join(VERIFY)}")
    root = Path(root).resolve()
    version = version or detect_version(root)
    check_tables(root, version)
    check_map_masks(root, version)
    table_files = [root / version / f"{t}.json" for t in TABLES]
    key = {"root": str(root), "version": version, "converter": CONVERTER_VERSION, "max_sweeps": max_sweeps,
           "verify": verify, "occ_root": str(occ_root or ""), "tables": file_fingerprint(table_files),
           "manifest": file_fingerprint([root / "drivebench_manifest.json"])}
    opts = {"max_sweeps": max_sweeps, "verify": verify, "occ_root": str(occ_root) if occ_root else "",
            "split_of": split_of(version)}
    records, problems = cached(cache_dir, "nuscenes-infos", key,
                               lambda: _convert(root, version, workers, opts), use_cache=use_cache)
    metainfo = {"dataset": "nuscenes", "version": version, "info_version": INFO_VERSION,
                "converter_version": CONVERTER_VERSION,
                "categories": {name: i for i, name in enumerate(DETECTION_CLASSES)}}
    return apply_policy(InfoIndex(records, metainfo, problems), on_corrupt)


def apply_policy(index: InfoIndex, on_corrupt: str) -> InfoIndex:
    bad = {p.sample_token for p in index.problems}
    if bad and on_corrupt == "fail":
        raise index.problems[0].error()
    if bad:
        index.records = [r for r in index.records if r["token"] not in bad]
        index.skipped = Counter(p.kind for p in {p.sample_token: p for p in index.problems}.values())
        for i, r in enumerate(index.records):
            r["sample_idx"] = i
    return index


def _convert(root: Path, version: str, workers: int, opts: dict) -> tuple[list[dict], list[Problem]]:
    _load_devkit(str(root), version)
    nusc = _NUSC["nusc"]
    jobs = [(scene["token"], i, opts) for i, scene in enumerate(nusc.scene)]
    try:
        if workers > 0 and len(jobs) > 1:
            ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context("spawn")
            with ProcessPoolExecutor(min(workers, len(jobs)), mp_context=ctx,
                                     **pool_kwargs(_init_worker, (str(root), version))) as pool:
                results = list(pool.map(_scene_records, jobs))
        else:
            results = [_scene_records(j) for j in jobs]
    finally:
        _NUSC.clear()
    records = [r for recs, _ in results for r in recs]
    problems = [p for _, probs in results for p in probs]
    for i, r in enumerate(records):
        r["sample_idx"] = i
    return records, problems


# ----------------------------------------------------------------------------------------------
# mmdetection3d v1.x interchange.

MMDET3D_KEYS = ("sample_idx", "token", "timestamp", "ego2global", "images", "lidar_points", "lidar_sweeps",
                "instances")
MMDET3D_INSTANCE_KEYS = ("bbox_3d", "bbox_label", "bbox_label_3d", "bbox_3d_isvalid", "velocity", "num_lidar_pts",
                         "num_radar_pts")
EXTENSION_KEYS = ("scene_token", "scene_name", "sequence_id", "frame_idx", "prev", "next", "split", "map_location",
                  "can_bus", "ego_status", "gt_ego_fut_trajs", "gt_ego_fut_masks", "gt_ego_fut_cmd", "occ_path")
INSTANCE_EXTENSION_KEYS = ("instance_token", "instance_id", "category_name", "attribute_name", "fut_trajs", "fut_masks")
DEFAULT_PREFIX = {**{cam: f"samples/{cam}" for cam in CAMERAS}, "pts": "samples/LIDAR_TOP", "sweeps": "sweeps/LIDAR_TOP"}


def to_mmdet3d_v1(records: list[dict] | InfoIndex, version: str | None = None, keep_extensions: bool = True) -> dict:
    """Records -> ``{"metainfo", "data_list"}`` as mmdet3d v1.x writes it (file names relative to
    the default ``data_prefix``). Extension keys ride along unless ``keep_extensions=False``;
    mmdet3d's datasets pass unknown keys through untouched."""
    if isinstance(records, InfoIndex):
        version = version or records.metainfo["version"]
        records = records.records
    data_list = []
    for r in records:
        out = {k: _copy(r[k]) for k in MMDET3D_KEYS}
        for cam in out["images"]:
            out["images"][cam]["img_path"] = Path(out["images"][cam]["img_path"]).name
        out["lidar_points"]["lidar_path"] = Path(out["lidar_points"]["lidar_path"]).name
        out["instances"] = [
            {k: v for k, v in inst.items() if keep_extensions or k in MMDET3D_INSTANCE_KEYS} for inst in out["instances"]
        ]
        if keep_extensions:
            out.update({k: _copy(r[k]) for k in EXTENSION_KEYS if k in r})
        data_list.append(out)
    metainfo = {"categories": {n: i for i, n in enumerate(DETECTION_CLASSES)}, "dataset": "nuscenes",
                "version": version or "", "info_version": INFO_VERSION}
    return {"metainfo": metainfo, "data_list": data_list}


def from_mmdet3d_v1(data: dict, dataroot: Path | str | None = None, data_prefix: dict | None = None,
                    **build_kwargs: Any) -> list[dict]:
    """mmdet3d v1.x info dict (from this module or mmdet3d's own converter) -> records.

    File names are joined with ``data_prefix`` (mmdet3d's default layout when None). Records that
    lack the drivebench extensions (mmdet3d's converter does not write them) are completed from the
    devkit by sample token, which needs ``dataroot``.
    """
    prefix = {**DEFAULT_PREFIX, **(data_prefix or {})}
    records = []
    for entry in data["data_list"]:
        r = _copy({k: entry[k] for k in entry})
        for cam, img in r["images"].items():
            img["img_path"] = f"{prefix[cam]}/{Path(img['img_path']).name}"
        r["lidar_points"]["lidar_path"] = f"{prefix['pts']}/{Path(r['lidar_points']['lidar_path']).name}"
        for sw in r.get("lidar_sweeps", []):
            sw["lidar_points"]["lidar_path"] = _dataset_relative(sw["lidar_points"]["lidar_path"], prefix["sweeps"])
        r.setdefault("lidar_sweeps", [])
        records.append(r)
    missing = [r for r in records if not all(k in r for k in EXTENSION_KEYS)
               or any(not all(k in i for k in INSTANCE_EXTENSION_KEYS) for i in r["instances"])]
    if missing:
        if dataroot is None:
            raise ValueError(
                f"{len(missing)} records lack drivebench's fields (scene, CAN bus, futures...): mmdet3d's own "
                "converter does not write them; pass dataroot= so they are rebuilt from the devkit"
            )
        version = data.get("metainfo", {}).get("version") or None
        full = {r["token"]: r for r in build_infos(dataroot, version, **build_kwargs).records}
        for r in missing:
            ref = full.get(r["token"])
            if ref is None:
                raise DataFileError(str(dataroot), r["token"], "sample token not found in the nuScenes tables")
            for k in EXTENSION_KEYS:
                r.setdefault(k, _copy(ref[k]))
            by_token = {i["instance_token"]: i for i in ref["instances"]}
            for inst, ref_inst in zip(r["instances"], ref["instances"]):
                src = by_token.get(inst.get("instance_token", ""), ref_inst)
                for k in INSTANCE_EXTENSION_KEYS:
                    inst.setdefault(k, _copy(src[k]))
    return records


def _dataset_relative(path: str, default_prefix: str) -> str:
    """Sweep paths in mmdet3d infos keep the converter's full path ('./data/nuscenes/sweeps/...'; a
    sweep chain also passes through earlier key frames under 'samples/'): keep it from the
    'samples/' or 'sweeps/' folder on; a bare file name gets the default sweeps folder."""
    parts = Path(path).parts
    for i, part in enumerate(parts):
        if part in ("samples", "sweeps"):
            return str(Path(*parts[i:]))
    return f"{default_prefix}/{Path(path).name}"


def _copy(v):
    if isinstance(v, dict):
        return {k: _copy(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_copy(x) for x in v]
    if isinstance(v, np.ndarray):
        return v.tolist()
    return v


__all__ = ["InfoIndex", "Problem", "build_infos", "to_mmdet3d_v1", "from_mmdet3d_v1", "CONVERTER_VERSION",
           "DETECTION_CLASSES", "LOCATIONS"]
