"""The sample index agrees with the devkit, round-trips through mmdet3d v1.x, and names bad files."""

from __future__ import annotations

import pickle
import shutil

import numpy as np
import pytest
from pyquaternion import Quaternion

from drivebench.data.nuscenes import CAMERAS
from drivebench.data.nuscenes.errors import CorruptFileError, DataFileError, MissingFileError, MissingTableError
from drivebench.data.nuscenes.generate import ensure_generated
from drivebench.data.nuscenes.infos import (
    DETECTION_CLASSES,
    EXTENSION_KEYS,
    build_infos,
    from_mmdet3d_v1,
    to_mmdet3d_v1,
)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return ensure_generated(tmp_path_factory.mktemp("nusc") / "mini", "mini", seed=0, workers=2, progress=False)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def index(root, cache_dir):
    return build_infos(root, workers=2, cache_dir=cache_dir)


@pytest.fixture(scope="module")
def nusc(root):
    from nuscenes.nuscenes import NuScenes

    return NuScenes(version="v1.0-mini", dataroot=str(root), verbose=False)


def test_index_covers_every_sample_with_splits_and_sequences(index, nusc):
    assert len(index) == len(nusc.sample)
    assert {r["split"] for r in index.records} == {"train", "val"}
    for r in index.records:
        scene = nusc.get("scene", r["scene_token"])
        assert r["scene_name"] == scene["name"]
        assert r["sequence_id"] == [s["token"] for s in nusc.scene].index(scene["token"])
        sample = nusc.get("sample", r["token"])
        assert (r["prev"], r["next"]) == (sample["prev"], sample["next"])
        assert r["frame_idx"] == 0 if not r["prev"] else r["frame_idx"] > 0
        assert r["timestamp"] == pytest.approx(sample["timestamp"] / 1e6)
        assert r["occ_path"] and r["map_location"]


def test_poses_calibrations_and_boxes_match_the_devkit(index, nusc):
    from nuscenes.utils.geometry_utils import view_points

    for r in index.records[::4]:
        sample = nusc.get("sample", r["token"])
        lidar_sd = nusc.get("sample_data", sample["data"]["LIDAR_TOP"])
        pose = nusc.get("ego_pose", lidar_sd["ego_pose_token"])
        cs = nusc.get("calibrated_sensor", lidar_sd["calibrated_sensor_token"])
        np.testing.assert_allclose(np.array(r["ego2global"])[:3, 3], pose["translation"], atol=1e-9)
        np.testing.assert_allclose(np.array(r["ego2global"])[:3, :3], Quaternion(pose["rotation"]).rotation_matrix, atol=1e-9)
        np.testing.assert_allclose(np.array(r["lidar_points"]["lidar2ego"])[:3, 3], cs["translation"], atol=1e-9)
        assert r["lidar_points"]["lidar_path"] == lidar_sd["filename"]
        _, boxes, _ = nusc.get_sample_data(lidar_sd["token"])
        assert len(boxes) == len(r["instances"])
        for box, inst in zip(boxes, r["instances"]):
            np.testing.assert_allclose(inst["bbox_3d"][:3], box.center, atol=1e-6)
            np.testing.assert_allclose(inst["bbox_3d"][3:6], box.wlh[[1, 0, 2]], atol=1e-6)  # l, w, h
            assert inst["bbox_3d"][6] == pytest.approx(box.orientation.yaw_pitch_roll[0], abs=1e-6)
        for cam in CAMERAS:
            img = r["images"][cam]
            path, cam_boxes, k = nusc.get_sample_data(sample["data"][cam])
            np.testing.assert_allclose(img["cam2img"], k, atol=1e-9)
            assert str(path).endswith(img["img_path"])
            # the info's lidar -> image projection puts each box centre where the devkit's camera-frame
            # box projects (the devkit moves boxes through the camera's own ego pose)
            lidar2img = np.eye(4)
            lidar2img[:3, :3] = k
            lidar2img = lidar2img @ np.array(img["lidar2cam"])
            by_token = {b.token: b for b in cam_boxes}
            for inst, ann_tok in zip(r["instances"], sample["anns"]):
                if ann_tok not in by_token or by_token[ann_tok].center[2] < 1.0:
                    continue
                ref = view_points(by_token[ann_tok].center[:, None], k, normalize=True)[:2, 0]
                uvw = lidar2img @ np.r_[inst["bbox_3d"][:3], 1.0]
                np.testing.assert_allclose(uvw[:2] / uvw[2], ref, atol=1e-3)


def test_can_bus_and_ego_targets_follow_upstream_layout(index, nusc, root):
    from nuscenes.can_bus.can_bus_api import NuScenesCanBus

    can = NuScenesCanBus(dataroot=str(root))
    for r in index.records[::3]:
        sample = nusc.get("sample", r["token"])
        pose = nusc.get("ego_pose", nusc.get("sample_data", sample["data"]["LIDAR_TOP"])["ego_pose_token"])
        v = np.array(r["can_bus"])
        assert v.shape == (18,)
        np.testing.assert_allclose(v[:3], pose["translation"])
        np.testing.assert_allclose(v[3:7], pose["rotation"])
        assert v[16] == pytest.approx(np.radians(v[17])) and 0 <= v[17] < 360
        msgs = [m for m in can.get_messages(r["scene_name"], "pose") if m["utime"] <= sample["timestamp"]]
        np.testing.assert_allclose(v[13:16], msgs[-1]["vel"])
        assert len(r["ego_status"]) == 10 and r["ego_status"][6] == pytest.approx(msgs[-1]["vel"][0], rel=0.05)
        steps = np.array(r["gt_ego_fut_trajs"])
        mask = np.array(r["gt_ego_fut_masks"])
        # ego futures: the LiDAR positions of the next key frames in this LiDAR frame
        cur, pos = sample, np.zeros(2)
        g2l = np.linalg.inv(np.array(r["ego2global"]) @ np.array(r["lidar_points"]["lidar2ego"]))
        for i in range(6):
            if not mask[i]:
                assert not cur["next"] or i > 0
                break
            cur = nusc.get("sample", cur["next"])
            sd = nusc.get("sample_data", cur["data"]["LIDAR_TOP"])
            p = nusc.get("ego_pose", sd["ego_pose_token"])
            c = nusc.get("calibrated_sensor", sd["calibrated_sensor_token"])
            lidar_g = Quaternion(p["rotation"]).rotation_matrix @ c["translation"] + p["translation"]
            pos = pos + steps[i]
            np.testing.assert_allclose(pos, (g2l[:3, :3] @ lidar_g + g2l[:3, 3])[:2], atol=1e-6)
        assert sum(r["gt_ego_fut_cmd"]) == 1


def test_agent_futures_follow_the_annotation_chain(index, nusc):
    checked = 0
    for r in index.records[:6]:
        g2l = np.linalg.inv(np.array(r["ego2global"]) @ np.array(r["lidar_points"]["lidar2ego"]))
        sample = nusc.get("sample", r["token"])
        for inst, ann_tok in zip(r["instances"], sample["anns"]):
            ann = nusc.get("sample_annotation", ann_tok)
            pos = np.array(inst["bbox_3d"][:2])
            for step, m in zip(inst["fut_trajs"], inst["fut_masks"]):
                if not m:
                    break
                ann = nusc.get("sample_annotation", ann["next"])
                pos = pos + step
                np.testing.assert_allclose(pos, (g2l[:3, :3] @ ann["translation"] + g2l[:3, 3])[:2], atol=1e-6)
                checked += 1
            assert inst["instance_id"] == nusc.getind("instance", ann["instance_token"])
    assert checked > 20


def test_mmdet3d_v1_round_trip(index, root, cache_dir):
    data = pickle.loads(pickle.dumps(to_mmdet3d_v1(index)))
    assert data["metainfo"]["categories"] == {n: i for i, n in enumerate(DETECTION_CLASSES)}
    first = data["data_list"][0]
    assert "/" not in first["images"]["CAM_FRONT"]["img_path"] and "/" not in first["lidar_points"]["lidar_path"]
    back = from_mmdet3d_v1(data)
    np.testing.assert_equal(back, index.records)  # NaN-aware: unestimable velocities stay NaN as in mmdet3d
    # mmdet3d's own converter writes no drivebench fields: they are rebuilt from the devkit by token
    plain = to_mmdet3d_v1(index, keep_extensions=False)
    assert not set(EXTENSION_KEYS) & set(plain["data_list"][0])
    with pytest.raises(ValueError, match="dataroot"):
        from_mmdet3d_v1(plain)
    rebuilt = from_mmdet3d_v1(plain, dataroot=root, cache_dir=cache_dir)
    np.testing.assert_equal(rebuilt, index.records)


def test_cache_is_reused(root, cache_dir, index, monkeypatch):
    import drivebench.data.nuscenes.infos as infos

    monkeypatch.setattr(infos, "_convert", lambda *a, **k: pytest.fail("rebuilt instead of loading the cache"))
    again = build_infos(root, cache_dir=cache_dir)
    assert [r["token"] for r in again.records] == [r["token"] for r in index.records]


def test_missing_table_is_named(root, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(root / "v1.0-mini", copy / "v1.0-mini")
    (copy / "v1.0-mini" / "sample_annotation.json").unlink()
    with pytest.raises(MissingTableError, match="sample_annotation.json"):
        build_infos(copy, use_cache=False)


def test_bad_files_are_named_with_their_sample_and_skip_counts_them(root, tmp_path, index):
    copy = tmp_path / "copy"
    shutil.copytree(root, copy)
    recs = index.records
    jpeg = copy / recs[2]["images"]["CAM_BACK"]["img_path"]
    jpeg.write_bytes(jpeg.read_bytes()[: len(jpeg.read_bytes()) // 2])  # truncated JPEG
    points = copy / recs[5]["lidar_points"]["lidar_path"]
    points.write_bytes(points.read_bytes()[:-7])  # not a multiple of 5 float32
    missing = copy / recs[9]["images"]["CAM_FRONT"]["img_path"]
    missing.unlink()
    with pytest.raises(DataFileError) as err:
        build_infos(copy, use_cache=False)
    assert str(jpeg) in str(err.value) and recs[2]["token"] in str(err.value)
    assert isinstance(err.value, CorruptFileError)
    skipped = build_infos(copy, use_cache=False, on_corrupt="skip")
    assert len(skipped) == len(recs) - 3
    assert skipped.skipped == {"corrupt_file": 2, "missing_file": 1}
    assert {p.sample_token for p in skipped.problems} == {recs[2]["token"], recs[5]["token"], recs[9]["token"]}
    assert [r["sample_idx"] for r in skipped.records] == list(range(len(skipped)))
    (copy / "maps" / "expansion" / f"{recs[0]['map_location']}.json").unlink()
    with pytest.raises(MissingFileError, match="map expansion"):
        build_infos(copy, use_cache=False)
