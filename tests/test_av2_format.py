"""The embedded Argoverse 2 set is in the real on-disk format: av2's own readers accept it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from av2.datasets.motion_forecasting.scenario_serialization import load_argoverse_scenario_parquet
from av2.map.map_api import ArgoverseStaticMap

from drivebench.data.argoverse2 import schema
from drivebench.data.argoverse2.generate import (
    IN_PROGRESS_NAME,
    MANIFEST_NAME,
    SIZES,
    ensure_generated,
    generate_av2,
    generate_scenario,
    read_manifest,
)
from drivebench.data.argoverse2.scenario import load_scenario_dir


@pytest.fixture(scope="module")
def mini_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate_av2(tmp_path_factory.mktemp("av2") / "mini", size="mini", seed=0, workers=0, progress=False)


def scenario_dirs(root: Path, split: str) -> list[Path]:
    return sorted(p for p in (root / split).iterdir() if p.is_dir())


def test_layout_and_counts_match_the_manifest(mini_root: Path) -> None:
    manifest = read_manifest(mini_root)
    assert manifest["size"] == "mini" and manifest["seed"] == 0
    for split in ("train", "val"):
        dirs = scenario_dirs(mini_root, split)
        assert len(dirs) == SIZES["mini"].count(split) == manifest["counts"][split]
        for d in dirs:
            assert sorted(p.name for p in d.iterdir()) == [f"log_map_archive_{d.name}.json", f"scenario_{d.name}.parquet"]
    assert not (mini_root / IN_PROGRESS_NAME).exists()
    train_ids = {d.name for d in scenario_dirs(mini_root, "train")}
    assert not train_ids & {d.name for d in scenario_dirs(mini_root, "val")}


def test_av2_reads_every_parquet_with_documented_columns(mini_root: Path) -> None:
    expected = list(schema.PARQUET_COLUMNS)
    for split in ("train", "val"):
        for d in scenario_dirs(mini_root, split):
            path = d / f"scenario_{d.name}.parquet"
            arrow = pq.read_schema(path)
            assert [(f.name, str(f.type)) for f in arrow] == expected
            scenario = load_argoverse_scenario_parquet(path)
            assert scenario.scenario_id == d.name
            assert scenario.city_name in schema.CITIES
            assert len(scenario.timestamps_ns) == schema.NUM_STEPS
            track_ids = [t.track_id for t in scenario.tracks]
            assert schema.AV_TRACK_ID in track_ids and scenario.focal_track_id in track_ids
            frame = pd.read_parquet(path)
            assert isinstance(frame.index, pd.RangeIndex)
            assert frame["object_type"].isin(schema.AGENT_TYPES).all()
            assert frame["object_category"].between(0, 3).all()
            assert (frame["observed"] == (frame["timestep"] < schema.NUM_HISTORICAL_STEPS)).all()
            assert not frame.duplicated(["track_id", "timestep"]).any()
            assert frame.groupby("track_id")["timestep"].apply(lambda s: s.is_monotonic_increasing).all()


def test_av2_reads_every_map(mini_root: Path) -> None:
    for split in ("train", "val"):
        for d in scenario_dirs(mini_root, split):
            path = d / f"log_map_archive_{d.name}.json"
            static_map = ArgoverseStaticMap.from_json(path)
            lanes = static_map.vector_lane_segments
            assert len(lanes) > 0 and len(static_map.vector_pedestrian_crossings) > 0
            assert len(static_map.vector_drivable_areas) > 0
            raw = json.loads(path.read_text())
            for lane in raw["lane_segments"].values():
                assert len(lane["centerline"]) >= 2
                for other in lane["predecessors"] + lane["successors"]:
                    assert other in lanes, "topology points at a lane that is not in the map"
                for neighbour in (lane["left_neighbor_id"], lane["right_neighbor_id"]):
                    assert neighbour is None or neighbour in lanes
            # Connectivity is symmetric: b succeeds a exactly when a precedes b.
            for lane in lanes.values():
                for succ in lane.successors:
                    assert lane.id in lanes[succ].predecessors


def test_map_has_intersections_turns_marks_and_city_coordinates(mini_root: Path) -> None:
    d = scenario_dirs(mini_root, "train")[0]
    static_map = ArgoverseStaticMap.from_json(d / f"log_map_archive_{d.name}.json")
    lanes = list(static_map.vector_lane_segments.values())
    in_intersection = [lane for lane in lanes if lane.is_intersection]
    assert in_intersection, "no intersection lanes"
    # A lane that branches (several successors) feeds the intersection.
    assert any(len(lane.successors) > 1 for lane in lanes)
    marks = {lane.left_mark_type.value for lane in lanes} | {lane.right_mark_type.value for lane in lanes}
    assert {"NONE"} < marks and any("YELLOW" in m for m in marks)
    xyz = np.concatenate([lane.left_lane_boundary.xyz for lane in lanes])
    assert np.abs(xyz[:, :2]).max() > 500.0, "coordinates should be city-frame (large offsets)"


def test_generation_is_a_function_of_seed_split_and_index(tmp_path: Path) -> None:
    first = generate_scenario(tmp_path / "a", "mini", 3, "train", 5)
    second = generate_scenario(tmp_path / "b", "mini", 3, "train", 5)
    other_seed = generate_scenario(tmp_path / "c", "mini", 4, "train", 5)
    assert first == second != other_seed
    for name in (f"scenario_{first}.parquet", f"log_map_archive_{first}.json"):
        assert (tmp_path / "a" / "train" / first / name).read_bytes() == (tmp_path / "b" / "train" / first / name).read_bytes()


def test_bench_scenarios_have_realistic_size(tmp_path: Path) -> None:
    agents, polygons, points = [], [], []
    for index in range(3):
        scenario_id = generate_scenario(tmp_path, "bench", 0, "train", index)
        raw = load_scenario_dir(tmp_path / "train" / scenario_id)
        agents.append(raw["agent"]["num_nodes"])
        polygons.append(raw["map_polygon"]["num_nodes"])
        points.append(raw["map_point"]["num_nodes"])
    assert 35 <= np.mean(agents) <= 90, agents
    assert 120 <= np.mean(polygons) <= 260, polygons
    assert 1000 <= np.mean(points) <= 2300, points


def test_ensure_generated_reuses_a_complete_set_and_redoes_an_interrupted_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import drivebench.data.argoverse2.generate as generate_module

    root = tmp_path / "set"
    real_generate = generate_module.generate_scenario

    def crash_midway(root_: Path, size: str, seed: int, split: str, index: int) -> str:
        if split == "train" and index == 12:
            raise KeyboardInterrupt("simulated interruption")
        return real_generate(root_, size, seed, split, index)

    monkeypatch.setattr(generate_module, "generate_scenario", crash_midway)
    with pytest.raises(KeyboardInterrupt):
        ensure_generated(root, size="mini", seed=1, progress=False)
    assert not (root / MANIFEST_NAME).exists() and (root / IN_PROGRESS_NAME).exists()
    monkeypatch.setattr(generate_module, "generate_scenario", real_generate)

    leftover = root / "train" / "leftover-from-the-crash"
    leftover.mkdir()
    ensure_generated(root, size="mini", seed=1, progress=False)
    assert (root / MANIFEST_NAME).exists() and not (root / IN_PROGRESS_NAME).exists() and not leftover.exists()
    assert len(scenario_dirs(root, "train")) == SIZES["mini"].train

    manifest_time = (root / MANIFEST_NAME).stat().st_mtime_ns
    assert ensure_generated(root, size="mini", seed=1, progress=False) == root
    assert (root / MANIFEST_NAME).stat().st_mtime_ns == manifest_time, "a complete set must not be rewritten"

    # A different seed is a different set: regenerated in place.
    old_ids = {d.name for d in scenario_dirs(root, "train")}
    ensure_generated(root, size="mini", seed=2, progress=False)
    assert read_manifest(root)["seed"] == 2
    assert not old_ids & {d.name for d in scenario_dirs(root, "train")}


def test_generator_refuses_a_folder_it_did_not_make(tmp_path: Path) -> None:
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "precious").write_text("real data")
    with pytest.raises(FileExistsError, match="not a drivebench-generated"):
        ensure_generated(tmp_path, size="mini", seed=0, progress=False)
    assert (tmp_path / "train" / "precious").exists()
    with pytest.raises(ValueError, match="size='huge'"):
        generate_av2(tmp_path / "other", size="huge")


def test_concurrent_callers_wait_for_the_generator(tmp_path: Path) -> None:
    """DDP ranks on one host call ensure_generated together; a lock makes them take turns."""
    import threading

    from drivebench.locks import exclusive_lock

    root = tmp_path / "shared"
    waiter = threading.Thread(target=ensure_generated, args=(root,), kwargs={"size": "mini", "progress": False})
    with exclusive_lock(tmp_path / ".shared.lock"):  # another rank is generating
        waiter.start()
        waiter.join(timeout=0.5)
        assert waiter.is_alive() and not root.exists(), "must wait for the lock holder"
    waiter.join(timeout=120)
    assert not waiter.is_alive() and read_manifest(root)["counts"]["train"] == SIZES["mini"].train
