"""Write the embedded nuScenes set: ``ensure_generated(root, size)`` makes it once and reuses it.

Sizes: ``mini`` (version v1.0-mini, 2 scenes x 10 key frames, 160x90 images: seconds) and
``bench`` (v1.0-trainval, 10 scenes x 20 key frames, 1600x900 images: a few minutes on two
cores). The per-key-frame work (6 camera renders + JPEG, the key LiDAR sweep and the sweeps before
it, the occupancy labels) runs in a process pool; the tables are written after it, and a manifest
last, so an interrupted run is detected (no manifest) and redone.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import shutil
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from drivebench.data.nuscenes import CAMERAS, LOCATIONS
from drivebench.data.nuscenes.lidar import cast
from drivebench.data.nuscenes.maps import CityMap, GroundRaster, build_city_map, build_ground_raster, make_token, write_map_files
from drivebench.data.nuscenes.occupancy import occupancy_labels
from drivebench.data.nuscenes.render import Renderer, encode_jpeg
from drivebench.data.nuscenes.tables import (
    TABLES,
    attribute_token,
    category_token,
    sensor_token,
    static_tables,
    visibility_token,
    write_can_bus,
    write_table,
)
from drivebench.data.nuscenes.world import (
    ANNOTATION_RANGE,
    CAMERA_OFFSET_US,
    KEYFRAME_US,
    Scene,
    SensorCalib,
    build_scene,
    matrix_to_quat,
    sensor_rig,
)
from drivebench.locks import exclusive_lock

GENERATOR_VERSION = 1
MANIFEST = "drivebench_manifest.json"
IN_PROGRESS = ".drivebench_generating"
GENERATED_DIRS = ("samples", "sweeps", "maps", "can_bus", "occupancy")
CAN_BLACKLIST = {161, 162, 163, 164, 165, 166, 167, 168, 170, 171, 172, 173, 174, 175, 176, 309, 310, 311, 312,
                 313, 314}


@dataclass(frozen=True)
class SizePreset:
    version: str
    train_scenes: int
    val_scenes: int
    keyframes: int
    image_size: tuple[int, int]
    grid: int  # intersections per axis of each city
    spacing: float  # metres between intersections
    lidar_azimuth: int  # columns of a key-frame sweep (32 rows)
    sweeps_per_keyframe: int  # LiDAR sweeps between key frames (9 = the real 20 Hz)
    sweep_azimuth: int  # columns of a non-key sweep (decimated: nothing trains on sweeps)
    jpeg_quality: int = 90


PRESETS: dict[str, SizePreset] = {
    "mini": SizePreset("v1.0-mini", 1, 1, 10, (160, 90), 4, 90.0, 360, 2, 180),
    # 12 train scenes: enough sequences for SparseDrive's streaming batches (6 per GPU, 2 GPUs)
    "bench": SizePreset("v1.0-trainval", 12, 2, 16, (1600, 900), 6, 100.0, 1084, 9, 271),
}
LOG_STYLE = {  # vehicle, date, time, utc offset, base timestamp (µs)
    "boston-seaport": ("n008", "2018-08-01", "15-16-36", "-0400", 1533151603547590),
    "singapore-onenorth": ("n015", "2018-07-18", "11-07-57", "+0800", 1531883530449377),
    "singapore-hollandvillage": ("n015", "2018-08-02", "17-16-37", "+0800", 1533201470448696),
    "singapore-queenstown": ("n015", "2018-11-21", "19-38-26", "+0800", 1542800367947819),
}


@dataclass
class FrameTask:
    """One key frame's files: what a worker renders, casts and writes."""

    scene: int
    k: int
    sample_token: str
    lidar_us: int
    sweep_us: list[int]
    camera_us: dict[str, int]
    annotated: list[int]  # agent indices annotated at this key frame
    files: dict[str, str] = field(default_factory=dict)


@dataclass
class Plan:
    seed: int
    preset: SizePreset
    image_size: tuple[int, int]
    cities: dict[str, CityMap]
    logs: list[dict]
    rigs: list[dict[str, SensorCalib]]
    scenes: list[Scene]
    frames: list[FrameTask]

    @property
    def version(self) -> str:
        return self.preset.version


def official_splits() -> dict[str, list[str]]:
    """Scene lists of ``nuscenes.utils.splits``, read without importing the devkit package.

    Why: importing ``nuscenes`` pulls sklearn, pandas and matplotlib (seconds); the lists are
    literals (and sums of them) in that file, so a tiny AST evaluator reads them.
    """
    import ast
    import importlib.util

    spec = importlib.util.find_spec("nuscenes")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("nuscenes-devkit is not installed; pip install nuscenes-devkit==1.2.0")
    path = Path(next(iter(spec.submodule_search_locations))) / "utils" / "splits.py"
    names: dict[str, list[str]] = {}

    def value(node: ast.AST) -> list[str]:
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return value(node.left) + value(node.right)
        if isinstance(node, ast.Name):
            return names[node.id]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) == 1:
            inner = value(node.args[0])  # list(...), sorted(...), set(...) as in `list(sorted(set(a + b)))`
            fn = {"list": list, "sorted": sorted, "set": lambda v: list(dict.fromkeys(v))}[node.func.id]
            return list(fn(inner))
        return list(ast.literal_eval(node))

    for stmt in ast.parse(path.read_text()).body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            try:
                names[stmt.targets[0].id] = value(stmt.value)
            except (ValueError, KeyError, TypeError, SyntaxError):
                continue
    return names


def scene_names(preset: SizePreset) -> tuple[list[str], list[str]]:
    """Official scene names (train first, then val) so the devkit's splits sort them correctly."""
    splits = official_splits()
    if preset.version == "v1.0-mini":
        train, val = splits["mini_train"], splits["mini_val"]
    else:
        train, val = splits["train"], splits["val"]
    ok = [n for n in train if int(n[-4:]) not in CAN_BLACKLIST]
    okv = [n for n in val if int(n[-4:]) not in CAN_BLACKLIST]
    if len(ok) < preset.train_scenes or len(okv) < preset.val_scenes:
        raise ValueError(f"size preset asks for more scenes than the {preset.version} split lists hold")
    return ok[: preset.train_scenes], okv[: preset.val_scenes]


def _logfile(location: str) -> tuple[str, str, str]:
    vehicle, date, clock, tz, _ = LOG_STYLE[location]
    return f"{vehicle}-{date}-{clock}{tz}", vehicle, date


def make_plan(seed: int, preset: SizePreset, image_size: tuple[int, int]) -> Plan:
    train, val = scene_names(preset)
    names = train + val
    used_locations = [LOCATIONS[i % len(LOCATIONS)] for i in range(len(names))]
    # every location gets a map (converters load all four); locations without scenes get a small one
    cities = {loc: build_city_map(loc, seed, preset.grid if loc in used_locations else 2, preset.spacing)
              for loc in LOCATIONS}
    logs = []
    for i, loc in enumerate(LOCATIONS):
        logfile, vehicle, date = _logfile(loc)
        logs.append({"token": make_token("log", seed, loc), "logfile": logfile, "vehicle": vehicle,
                     "date_captured": date, "location": loc})
    rigs = [sensor_rig(seed, i, image_size) for i in range(len(logs))]
    scenes: list[Scene] = []
    frames: list[FrameTask] = []
    per_log: dict[int, int] = {}
    for idx, (name, loc) in enumerate(zip(names, used_locations)):
        log_index = LOCATIONS.index(loc)
        n_before = per_log.get(log_index, 0)
        per_log[log_index] = n_before + 1
        start_us = LOG_STYLE[loc][4] + n_before * 60_000_000
        scene = build_scene(cities[loc], seed, idx, name, log_index, preset.keyframes, start_us)
        scenes.append(scene)
        logfile = logs[log_index]["logfile"]
        prev_us = scene.keyframe_us[0] - KEYFRAME_US
        for k, ts in enumerate(scene.keyframe_us):
            n = preset.sweeps_per_keyframe
            sweeps = [int(prev_us + (ts - prev_us) * (j + 1) / (n + 1)) for j in range(n)]
            prev_us = ts
            cams = {cam: ts + CAMERA_OFFSET_US[cam] for cam in CAMERAS}
            ego = scene.ego_pose(ts)
            boxes, _ = scene.agent_boxes(ts)
            dist = np.linalg.norm(boxes[:, :2] - ego[:2, 3], axis=1) if len(boxes) else np.zeros(0)
            annotated = [int(i) for i in np.flatnonzero(dist < ANNOTATION_RANGE)]
            task = FrameTask(idx, k, make_token("sample", seed, name, k), ts, sweeps, cams, annotated)
            task.files["LIDAR_TOP"] = f"samples/LIDAR_TOP/{logfile}__LIDAR_TOP__{ts}.pcd.bin"
            for j, sts in enumerate(sweeps):
                task.files[f"sweep{j}"] = f"sweeps/LIDAR_TOP/{logfile}__LIDAR_TOP__{sts}.pcd.bin"
            for cam, cts in cams.items():
                task.files[cam] = f"samples/{cam}/{logfile}__{cam}__{cts}.jpg"
            task.files["occupancy"] = f"occupancy/{logfile}__LIDAR_TOP__{ts}.pcd.bin.npy"
            frames.append(task)
    return Plan(seed, preset, image_size, cities, logs, rigs, scenes, frames)


# ----------------------------------------------------------------------------------------------
# Worker side: everything a key frame needs, built lazily once per process.

_STATE: dict = {}


def _init_worker(plan: Plan, root: str, single_thread: bool = False) -> None:
    if single_thread:  # one process per core: nested thread pools only oversubscribe
        import cv2

        cv2.setNumThreads(1)
        try:
            from threadpoolctl import threadpool_limits

            _STATE["_limits"] = threadpool_limits(1)
        except ImportError:  # pragma: no cover - threadpoolctl ships with scikit-learn
            pass
    limits = _STATE.get("_limits")
    _STATE.clear()
    if limits is not None:
        _STATE["_limits"] = limits
    _STATE.update(plan=plan, root=Path(root), renderers={}, grounds={})


def _renderer(loc: str) -> Renderer:
    plan: Plan = _STATE["plan"]
    if loc not in _STATE["renderers"]:
        _STATE["renderers"][loc] = Renderer(plan.cities[loc], plan.image_size, noise_seed=plan.seed)
    return _STATE["renderers"][loc]


def _ground(loc: str) -> GroundRaster:
    if loc not in _STATE["grounds"]:
        _STATE["grounds"][loc] = build_ground_raster(_STATE["plan"].cities[loc])
    return _STATE["grounds"][loc]


def _write_bytes(path: Path, data: bytes) -> None:
    # no temp-and-rename per file: the manifest, written last, is what marks the set complete
    path.write_bytes(data)


def _render_frame(i: int) -> tuple[int, dict[int, int]]:
    plan: Plan = _STATE["plan"]
    root: Path = _STATE["root"]
    task = plan.frames[i]
    scene = plan.scenes[task.scene]
    rig = plan.rigs[scene.log_index]
    renderer = _renderer(scene.location)
    ground = _ground(scene.location)
    colors = np.array([a.color for a in scene.agents], np.float64).reshape(-1, 3)
    rng = np.random.default_rng([plan.seed, task.scene, task.k])
    for cam in CAMERAS:
        ts = task.camera_us[cam]
        boxes, _ = scene.agent_boxes(ts)
        cam2global = scene.ego_pose(ts) @ rig[cam].sensor2ego
        img = renderer.render(cam2global, np.array(rig[cam].intrinsic), boxes, colors, rng=rng)
        _write_bytes(root / task.files[cam], encode_jpeg(img, plan.preset.jpeg_quality))
    static = renderer.static_boxes
    counts: dict[int, int] = {}
    sweeps = [(task.lidar_us, "LIDAR_TOP", plan.preset.lidar_azimuth)]
    sweeps += [(ts, f"sweep{j}", plan.preset.sweep_azimuth) for j, ts in enumerate(task.sweep_us)]
    for ts, key, n_az in sweeps:
        boxes, _ = scene.agent_boxes(ts)
        all_boxes = np.concatenate([static, boxes]) if len(boxes) else static
        ids = np.concatenate([np.full(len(static), -1), np.arange(len(boxes))])
        sensor2global = scene.ego_pose(ts) @ rig["LIDAR_TOP"].sensor2ego
        pts, _ = cast(sensor2global, n_az, all_boxes, ids, ground, rng)
        _write_bytes(root / task.files[key], pts.astype(np.float32).tobytes())
        if key == "LIDAR_TOP":
            # num_lidar_pts as nuScenes defines it: points inside the annotated box
            pts_g = pts[:, :3].astype(np.float64) @ sensor2global[:3, :3].T + sensor2global[:3, 3]
            counts = {a: _points_in_box(pts_g, boxes[a]) for a in task.annotated}
            boxes_key = boxes
    lidar2global = scene.ego_pose(task.lidar_us) @ rig["LIDAR_TOP"].sensor2ego
    occ = occupancy_labels(lidar2global, ground, plan.cities[scene.location].trees, boxes_key,
                           [a.category for a in scene.agents])
    np.save(root / task.files["occupancy"], occ)
    return i, counts


def _points_in_box(pts: np.ndarray, box: np.ndarray) -> int:
    x, y, z, w, l, h, yaw = box
    d = pts - (x, y, z)
    c, s = np.cos(yaw), np.sin(yaw)
    along = d[:, 0] * c + d[:, 1] * s
    across = -d[:, 0] * s + d[:, 1] * c
    return int(((np.abs(along) <= l / 2) & (np.abs(across) <= w / 2) & (np.abs(d[:, 2]) <= h / 2)).sum())


def _write_map(loc: str) -> str:
    plan: Plan = _STATE["plan"]
    write_map_files(plan.cities[loc], _STATE["root"], map_token(plan.seed, loc))
    return loc


def map_token(seed: int, location: str) -> str:
    return make_token("map", seed, location)


# ----------------------------------------------------------------------------------------------
# Tables.


def _ego_pose_record(scene: Scene, ts: int, token: str) -> dict:
    m = scene.ego_pose(ts)
    return {"token": token, "timestamp": int(ts), "rotation": matrix_to_quat(m[:3, :3]),
            "translation": [float(m[0, 3]), float(m[1, 3]), 0.0]}


def build_tables(plan: Plan, counts: dict[int, dict[int, int]]) -> dict[str, list[dict]]:
    seed = plan.seed
    w, h = plan.image_size
    tables = static_tables()
    tables["log"] = plan.logs
    tables["map"] = [{"token": map_token(seed, loc), "log_tokens": [lg["token"] for lg in plan.logs if lg["location"] == loc],
                      "category": "semantic_prior", "filename": f"maps/{map_token(seed, loc)}.png"}
                     for loc in LOCATIONS]
    calib = []
    for li, rig in enumerate(plan.rigs):
        for channel, c in rig.items():
            calib.append({"token": make_token("calib", seed, li, channel), "sensor_token": sensor_token(channel),
                          "translation": c.translation, "rotation": c.rotation, "camera_intrinsic": c.intrinsic})
    tables["calibrated_sensor"] = calib
    ego_poses, sample_data, samples, scenes, annotations, instances = [], [], [], [], [], []
    frames_by_scene: dict[int, list[int]] = {}
    for i, f in enumerate(plan.frames):
        frames_by_scene.setdefault(f.scene, []).append(i)
    for s_idx, scene in enumerate(plan.scenes):
        fidx = frames_by_scene[s_idx]
        log = plan.logs[scene.log_index]
        tokens = [plan.frames[i].sample_token for i in fidx]
        for n, i in enumerate(fidx):
            f = plan.frames[i]
            samples.append({"token": f.sample_token, "timestamp": f.lidar_us, "prev": tokens[n - 1] if n else "",
                            "next": tokens[n + 1] if n + 1 < len(tokens) else "", "scene_token": scene.token})
        scenes.append({"token": scene.token, "log_token": log["token"], "nbr_samples": len(fidx),
                       "first_sample_token": tokens[0], "last_sample_token": tokens[-1], "name": scene.name,
                       "description": f"drivebench embedded scene, {scene.location}, turns: {', '.join(scene.route_turns) or 'none'}"})
        # sample_data chains, one per channel
        for channel in ("LIDAR_TOP", *CAMERAS):
            chain = []
            for i in fidx:
                f = plan.frames[i]
                if channel == "LIDAR_TOP":
                    for j, ts in enumerate(f.sweep_us):
                        chain.append((ts, f.files[f"sweep{j}"], False, f.sample_token))
                    chain.append((f.lidar_us, f.files["LIDAR_TOP"], True, f.sample_token))
                else:
                    chain.append((f.camera_us[channel], f.files[channel], True, f.sample_token))
            toks = [make_token("sample_data", seed, s_idx, channel, ts) for ts, *_ in chain]
            cs_tok = make_token("calib", seed, scene.log_index, channel)
            is_cam = channel != "LIDAR_TOP"
            for n, (ts, fname, key, sample_tok) in enumerate(chain):
                pose_tok = make_token("ego_pose", seed, s_idx, channel, ts)
                ego_poses.append(_ego_pose_record(scene, ts, pose_tok))
                sample_data.append({
                    "token": toks[n], "sample_token": sample_tok, "ego_pose_token": pose_tok,
                    "calibrated_sensor_token": cs_tok, "timestamp": int(ts), "fileformat": "jpg" if is_cam else "pcd",
                    "is_key_frame": key, "height": h if is_cam else 0, "width": w if is_cam else 0, "filename": fname,
                    "prev": toks[n - 1] if n else "", "next": toks[n + 1] if n + 1 < len(toks) else "",
                })
        # annotations: one chain per agent over the key frames where it is within range
        by_agent: dict[int, list[tuple[int, str]]] = {}
        for i in fidx:
            for a in plan.frames[i].annotated:
                by_agent.setdefault(a, []).append((i, make_token("annotation", seed, s_idx, a, plan.frames[i].k)))
        for a, anns in sorted(by_agent.items()):
            agent = scene.agents[a]
            inst_tok = agent.token
            instances.append({"token": inst_tok, "category_token": category_token(agent.category),
                              "nbr_annotations": len(anns), "first_annotation_token": anns[0][1],
                              "last_annotation_token": anns[-1][1]})
            for n, (i, ann_tok) in enumerate(anns):
                f = plan.frames[i]
                box = agent.boxes(scene.t(f.lidar_us))[0]
                ego = scene.ego_pose(f.lidar_us)
                n_pts = counts[i].get(a, 0)
                attr = agent.attribute(float(scene.t(f.lidar_us)))
                annotations.append({
                    "token": ann_tok, "sample_token": f.sample_token, "instance_token": inst_tok,
                    "visibility_token": visibility_token(n_pts, box, float(np.linalg.norm(box[:2] - ego[:2, 3]))),
                    "attribute_tokens": [attribute_token(attr)] if attr else [],
                    "translation": [float(box[0]), float(box[1]), float(box[2])],
                    "size": [float(box[3]), float(box[4]), float(box[5])],
                    "rotation": [float(np.cos(box[6] / 2)), 0.0, 0.0, float(np.sin(box[6] / 2))],
                    "prev": anns[n - 1][1] if n else "", "next": anns[n + 1][1] if n + 1 < len(anns) else "",
                    "num_lidar_pts": n_pts, "num_radar_pts": 0,
                })
    tables.update(ego_pose=ego_poses, sample_data=sample_data, sample=samples, scene=scenes,
                  sample_annotation=annotations, instance=instances)
    assert set(tables) == set(TABLES), sorted(set(TABLES) ^ set(tables))
    return tables


# ----------------------------------------------------------------------------------------------


def _manifest_params(size: str, seed: int, preset: SizePreset, image_size: tuple[int, int]) -> dict:
    return {"generator_version": GENERATOR_VERSION, "size": size, "seed": seed, "version": preset.version,
            "image_size": list(image_size), "preset": asdict(preset) | {"image_size": list(preset.image_size)}}


def read_manifest(root: Path) -> dict | None:
    try:
        return json.loads((Path(root) / MANIFEST).read_text())
    except (OSError, ValueError):
        return None


def _wipe(root: Path, version: str) -> None:
    for name in (*GENERATED_DIRS, version, "v1.0-mini", "v1.0-trainval"):
        shutil.rmtree(root / name, ignore_errors=True)
    (root / MANIFEST).unlink(missing_ok=True)


def ensure_generated(
    root: Path | str,
    size: str,
    seed: int = 0,
    workers: int = 0,
    image_size: tuple[int, int] | None = None,
    progress: bool = True,
) -> Path:
    """Make the embedded set of ``size`` under ``root`` unless a complete one with the same
    parameters is there; return ``root`` (the ``dataroot`` the devkit takes)."""
    if size not in PRESETS:
        raise ValueError(f"size={size!r} is not an embedded nuScenes size; choose one of: {', '.join(PRESETS)}")
    root = Path(root)
    preset = PRESETS[size]
    image_size = tuple(int(v) for v in (image_size or preset.image_size))
    if len(image_size) != 2 or min(image_size) < 16:
        raise ValueError(f"image_size={image_size!r}: give (width, height), each at least 16 pixels")
    params = _manifest_params(size, seed, preset, image_size)
    if read_manifest(root) == params:
        return root
    with exclusive_lock(root / ".drivebench_generate.lock"):
        if read_manifest(root) == params:
            return root
        foreign = (root / preset.version).exists() and not (root / IN_PROGRESS).exists() and read_manifest(root) is None
        if foreign:
            raise FileExistsError(
                f"{root} holds a nuScenes {preset.version} that drivebench did not generate; point the embedded "
                "set at an empty directory (or use this one as a real dataset root)"
            )
        _wipe(root, preset.version)
        (root / IN_PROGRESS).write_text(json.dumps(params))
        _generate(root, size, seed, preset, image_size, workers, progress)
        (root / IN_PROGRESS).unlink(missing_ok=True)
        tmp = root / f".{MANIFEST}.tmp"
        tmp.write_text(json.dumps(params, indent=1))
        tmp.replace(root / MANIFEST)
    return root


def _generate(root: Path, size: str, seed: int, preset: SizePreset, image_size: tuple[int, int], workers: int,
              progress: bool) -> None:
    t0 = time.perf_counter()
    plan = make_plan(seed, preset, image_size)
    for d in ("samples/LIDAR_TOP", "sweeps/LIDAR_TOP", "maps/expansion", "occupancy", preset.version,
              *(f"samples/{c}" for c in CAMERAS)):
        (root / d).mkdir(parents=True, exist_ok=True)
    counts: dict[int, dict[int, int]] = {}
    jobs = list(range(len(plan.frames)))
    bar = _progress(len(jobs) + len(LOCATIONS), f"nuScenes {size}: rendering", progress)
    if workers <= 0:
        _init_worker(plan, str(root))
        for loc in LOCATIONS:
            _write_map(loc)
            bar.update(1)
        for i in jobs:
            _, counts[i] = _render_frame(i)
            bar.update(1)
    else:
        ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context("spawn")
        with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker,
                                 initargs=(plan, str(root), True)) as pool:
            futures = [pool.submit(_write_map, loc) for loc in LOCATIONS]
            futures += [pool.submit(_render_frame, i) for i in jobs]
            for fut in as_completed(futures):
                res = fut.result()
                if isinstance(res, tuple):
                    counts[res[0]] = res[1]
                bar.update(1)
    bar.close()
    for scene in plan.scenes:
        write_can_bus(root, scene, scene.keyframe_us[-1])
    tables = build_tables(plan, counts)
    for name, rows in tables.items():
        write_table(root / preset.version, name, rows)
    _STATE.clear()
    if progress:
        print(f"nuScenes {size} written to {root} in {time.perf_counter() - t0:.1f} s")


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def _progress(total: int, desc: str, enabled: bool):
    if not enabled:
        return _NoBar()
    try:
        from tqdm import tqdm

        return tqdm(total=total, desc=desc, unit="frame")
    except ImportError:  # pragma: no cover
        return _NoBar()


if __name__ == "__main__":  # pragma: no cover - manual use: python -m drivebench.data.nuscenes.generate ROOT SIZE
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root")
    ap.add_argument("size", choices=sorted(PRESETS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--image-size", type=int, nargs=2, default=None)
    a = ap.parse_args()
    ensure_generated(a.root, a.size, a.seed, a.workers, tuple(a.image_size) if a.image_size else None)
