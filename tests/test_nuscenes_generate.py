"""The embedded nuScenes set is read unchanged by the official devkit and is self-consistent."""

from __future__ import annotations

import json
import math
import shutil

import cv2
import numpy as np
import pytest

from drivebench.data.nuscenes import CAMERAS, LOCATIONS
from drivebench.data.nuscenes.generate import MANIFEST, PRESETS, ensure_generated, make_plan, official_splits
from drivebench.data.nuscenes.render import Renderer
from drivebench.data.nuscenes.tables import TABLES


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return ensure_generated(tmp_path_factory.mktemp("nusc") / "mini", "mini", seed=0, workers=2, progress=False)


@pytest.fixture(scope="module")
def nusc(root):
    from nuscenes.nuscenes import NuScenes

    return NuScenes(version="v1.0-mini", dataroot=str(root), verbose=False)


def test_devkit_loads_tables_and_token_chains(root, nusc):
    assert sorted(p.stem for p in (root / "v1.0-mini").glob("*.json")) == sorted(TABLES)
    names = {s["name"] for s in nusc.scene}
    splits = official_splits()
    assert names & set(splits["mini_train"]) and names & set(splits["mini_val"]), "both splits must be present"
    assert {lg["location"] for lg in nusc.log} == set(LOCATIONS)
    assert {t for m in nusc.map for t in m["log_tokens"]} == {lg["token"] for lg in nusc.log}
    for scene in nusc.scene:
        sample = nusc.get("sample", scene["first_sample_token"])
        assert sample["prev"] == ""
        n = 1
        while sample["next"]:
            nxt = nusc.get("sample", sample["next"])
            assert nxt["prev"] == sample["token"] and nxt["timestamp"] > sample["timestamp"]
            sample, n = nxt, n + 1
        assert n == scene["nbr_samples"] and sample["token"] == scene["last_sample_token"]
        first = nusc.get("sample", scene["first_sample_token"])
        for channel in ("LIDAR_TOP", *CAMERAS):
            sd = nusc.get("sample_data", first["data"][channel])
            while sd["prev"]:
                sd = nusc.get("sample_data", sd["prev"])
            keys, last_ts = 0, -1
            while True:
                assert sd["timestamp"] > last_ts
                last_ts = sd["timestamp"]
                if not sd["is_key_frame"]:  # sweeps point at the next key frame
                    nxt = sd
                    while not nxt["is_key_frame"]:
                        nxt = nusc.get("sample_data", nxt["next"])
                    assert sd["sample_token"] == nxt["sample_token"]
                keys += sd["is_key_frame"]
                if not sd["next"]:
                    break
                assert nusc.get("sample_data", sd["next"])["prev"] == sd["token"]
                sd = nusc.get("sample_data", sd["next"])
            assert keys == scene["nbr_samples"]


def test_sensor_mounting_is_nuscenes_like(nusc):
    from pyquaternion import Quaternion

    sample = nusc.sample[0]
    lidar_cs = nusc.get("calibrated_sensor", nusc.get("sample_data", sample["data"]["LIDAR_TOP"])["calibrated_sensor_token"])
    assert abs(math.degrees(Quaternion(lidar_cs["rotation"]).yaw_pitch_roll[0]) + 90) < 2
    for cam, yaw in (("CAM_FRONT", 0), ("CAM_FRONT_LEFT", 55), ("CAM_BACK", 180), ("CAM_BACK_RIGHT", -110)):
        sd = nusc.get("sample_data", sample["data"][cam])
        cs = nusc.get("calibrated_sensor", sd["calibrated_sensor_token"])
        r = Quaternion(cs["rotation"]).rotation_matrix
        z_axis, y_axis = r[:, 2], r[:, 1]  # camera z forward, y down
        heading = math.degrees(math.atan2(z_axis[1], z_axis[0]))
        assert (heading - yaw + 180) % 360 - 180 == pytest.approx(0, abs=3)
        assert y_axis[2] < -0.95
        k = np.array(cs["camera_intrinsic"])
        assert k[0, 2] == pytest.approx(sd["width"] / 2, rel=0.1) and k[1, 2] == pytest.approx(sd["height"] / 2, rel=0.15)


def _render_pair(plan, scene, cam, ts):
    """The frame as generated, and the same frame without the agents, with identical noise."""
    rig = plan.rigs[scene.log_index]
    renderer = Renderer(plan.cities[scene.location], plan.image_size, noise_seed=plan.seed)
    boxes, agents = scene.agent_boxes(ts)
    colors = np.array([a.color for a in agents], float)
    c2g = scene.ego_pose(ts) @ rig[cam].sensor2ego
    k = np.array(rig[cam].intrinsic)
    with_obj = renderer.render(c2g, k, boxes, colors, rng=np.random.default_rng(1))
    without = renderer.render(c2g, k, boxes, colors, include_objects=False, rng=np.random.default_rng(1))
    return with_obj.astype(float), without.astype(float)


def test_projected_box_centre_lands_where_the_box_was_drawn(root, nusc):
    from nuscenes.utils.geometry_utils import BoxVisibility, view_points

    preset = PRESETS["mini"]
    plan = make_plan(0, preset, preset.image_size)
    scene_by_name = {s.name: s for s in plan.scenes}
    checked = agree = 0
    for sample in nusc.sample[::3]:
        scene = scene_by_name[nusc.get("scene", sample["scene_token"])["name"]]
        for cam in CAMERAS:
            sd_tok = sample["data"][cam]
            path, boxes, k = nusc.get_sample_data(sd_tok, box_vis_level=BoxVisibility.ANY)
            sd = nusc.get("sample_data", sd_tok)
            best = None
            for box in boxes:
                uv = view_points(box.center[:, None], k, normalize=True)[:2, 0]
                depth = box.center[2]
                if depth > 2.0 and 2 <= uv[0] < sd["width"] - 2 and 2 <= uv[1] < sd["height"] - 2:
                    if best is None or depth < best[0]:
                        best = (depth, uv)
            if best is None:
                continue
            u, v = int(best[1][0]), int(best[1][1])
            with_obj, without = _render_pair(plan, scene, cam, sd["timestamp"])
            patch = (slice(v - 1, v + 2), slice(u - 1, u + 2))
            if np.abs(with_obj[patch] - without[patch]).mean() < 12:
                continue  # same colour as the background there (or hidden): nothing to compare
            checked += 1
            jpeg = cv2.imread(str(path)).astype(float)
            assert jpeg.shape[:2] == (sd["height"], sd["width"])
            agree += np.abs(jpeg[patch] - with_obj[patch]).mean() < np.abs(jpeg[patch] - without[patch]).mean()
    assert checked >= 5, "too few boxes visible in front of the cameras to check"
    assert agree == checked


def test_map_expansion_loads_and_every_token_resolves(root, nusc):
    from nuscenes.map_expansion.map_api import NuScenesMap

    for loc in LOCATIONS:
        m = NuScenesMap(dataroot=str(root), map_name=loc)
        assert m.version >= "1.3" and len(m.canvas_edge) == 2
        for layer in m.non_geometric_layers + ["lane_connector"]:
            assert getattr(m, layer), f"{loc}: layer {layer} is empty"
        nodes = {n["token"] for n in m.node}
        for poly in m.polygon:
            assert set(poly["exterior_node_tokens"]) <= nodes
            assert all(set(h["node_tokens"]) <= nodes for h in poly["holes"])
        for line in m.line:
            assert set(line["node_tokens"]) <= nodes
        for sl in m.stop_line:
            for t in sl["ped_crossing_tokens"]:
                m.get("ped_crossing", t)
            for t in sl["traffic_light_tokens"]:
                m.get("traffic_light", t)
        lanes = {r["token"] for r in m.lane} | {r["token"] for r in m.lane_connector}
        assert set(m.arcline_path_3) == lanes and set(m.connectivity) == lanes
        for conn in m.connectivity.values():
            assert set(conn["incoming"]) <= lanes and set(conn["outgoing"]) <= lanes
        shapes = {a["shape"] for paths in m.arcline_path_3.values() for a in paths}
        assert {"LSR", "LSL", "RSR"} <= shapes, "straight lanes and both turn directions"
    # around the ego of a sample: the usual queries answer
    sample = nusc.sample[4]
    pose = nusc.get("ego_pose", nusc.get("sample_data", sample["data"]["LIDAR_TOP"])["ego_pose_token"])
    loc = nusc.get("log", nusc.get("scene", sample["scene_token"])["log_token"])["location"]
    m = NuScenesMap(dataroot=str(root), map_name=loc)
    x, y = pose["translation"][:2]
    recs = m.get_records_in_patch((x - 40, y - 40, x + 40, y + 40), m.non_geometric_layers, mode="intersect")
    for layer in ("lane", "road_segment", "ped_crossing", "lane_divider", "road_divider", "walkway", "drivable_area"):
        assert recs[layer], layer
    on = m.layers_on_point(x, y)
    assert on["drivable_area"] and (on["lane"] or on["road_segment"])
    lane = m.get_closest_lane(x, y, radius=3)
    assert lane and len(m.discretize_lanes([lane], 1.0)[lane]) > 5


def test_can_bus_api_reads_every_message(root, nusc):
    from nuscenes.can_bus.can_bus_api import NuScenesCanBus

    can = NuScenesCanBus(dataroot=str(root))
    for scene in nusc.scene:
        for msg in can.can_messages + ["meta", "route"]:
            assert can.get_messages(scene["name"], msg)
        poses = can.get_messages(scene["name"], "pose")
        utimes = np.array([p["utime"] for p in poses])
        sample = nusc.get("sample", scene["first_sample_token"])
        ego = nusc.get("ego_pose", nusc.get("sample_data", sample["data"]["LIDAR_TOP"])["ego_pose_token"])
        near = poses[int(np.abs(utimes - ego["timestamp"]).argmin())]
        assert np.linalg.norm(np.array(near["pos"][:2]) - ego["translation"][:2]) < 0.3
        assert set(near) == {"accel", "orientation", "pos", "rotation_rate", "utime", "vel"}


def test_lidar_points_and_counts_match_the_devkit(root, nusc):
    from nuscenes.utils.data_classes import LidarPointCloud
    from nuscenes.utils.geometry_utils import points_in_box

    checked = 0
    for sample in nusc.sample[::4]:
        path, boxes, _ = nusc.get_sample_data(sample["data"]["LIDAR_TOP"])
        raw = np.fromfile(path, np.float32)
        assert raw.size % 5 == 0
        pc = LidarPointCloud.from_file(str(path))
        assert pc.points.shape[0] == 4 and pc.points.shape[1] > 1000
        ring = raw.reshape(-1, 5)[:, 4]
        assert ring.min() >= 0 and ring.max() <= 31
        for box, ann_tok in zip(boxes, sample["anns"]):
            ann = nusc.get("sample_annotation", ann_tok)
            inside = int(points_in_box(box, pc.points[:3]).sum())
            assert abs(inside - ann["num_lidar_pts"]) <= 2 + 0.1 * ann["num_lidar_pts"]
            checked += ann["num_lidar_pts"] > 10
    assert checked > 3


def test_occupancy_labels_describe_the_scene(root, nusc):
    from drivebench.data.nuscenes.occupancy import densify

    files = sorted((root / "occupancy").glob("*.npy"))
    assert len(files) == len(nusc.sample)
    classes = set()
    for f in files[::5]:
        sparse = np.load(f)
        assert sparse.ndim == 2 and sparse.shape[1] == 4
        dense, mask = densify(sparse.astype(np.int64))
        assert dense.shape == (200, 200, 16) and mask.all()
        # under the LiDAR (grid centre) is drivable surface, at the ground layer (z ~ -1.84 m -> index 6)
        assert dense[98:102, 98:102, 6].min() == 11 == dense[98:102, 98:102, 6].max()
        classes |= set(np.unique(sparse[:, 3]).tolist())
    assert {4, 11, 13, 15} <= classes and 17 not in classes and 0 not in classes


def test_manifest_guards_reuse_and_interrupted_runs(root, tmp_path):
    manifest = json.loads((root / MANIFEST).read_text())
    assert manifest["size"] == "mini" and manifest["version"] == "v1.0-mini"
    assert ensure_generated(root, "mini", seed=0, progress=False) == root  # complete: reused as is
    copy = tmp_path / "copy"
    shutil.copytree(root, copy)
    (copy / MANIFEST).unlink()  # an interrupted run never wrote it ...
    (copy / ".drivebench_generating").write_text("{}")
    (copy / "v1.0-mini" / "sample.json").unlink()
    ensure_generated(copy, "mini", seed=0, workers=2, progress=False)  # ... so the set is made again
    assert (copy / "v1.0-mini" / "sample.json").exists() and (copy / MANIFEST).exists()
    foreign = tmp_path / "real"
    (foreign / "v1.0-mini").mkdir(parents=True)
    with pytest.raises(FileExistsError, match="did not generate"):
        ensure_generated(foreign, "mini", progress=False)
