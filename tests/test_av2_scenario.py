"""load_scenario_dir: real Argoverse 2 files -> RawScenario, with QCNet's semantics and clear errors."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from drivebench.data.argoverse2 import schema
from drivebench.data.argoverse2.generate import generate_av2
from drivebench.data.argoverse2.scenario import Argoverse2FormatError, load_scenario_dir

REAL_SPLIT = Path(__file__).parent / "fixtures" / "av2-real" / "split"
REAL_DIR = next(p for p in REAL_SPLIT.iterdir() if p.is_dir())


@pytest.fixture(scope="module")
def mini_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate_av2(tmp_path_factory.mktemp("av2") / "mini", size="mini", seed=0, workers=0, progress=False)


def expected_counts(scenario_dir: Path) -> dict:
    """What the files say, computed without the converter."""
    sid = scenario_dir.name
    frame = pd.read_parquet(scenario_dir / f"scenario_{sid}.parquet")
    in_history = frame[frame["timestep"] < schema.NUM_HISTORICAL_STEPS]
    raw_map = json.loads((scenario_dir / f"log_map_archive_{sid}.json").read_text())
    lanes = list(raw_map["lane_segments"].values())
    crossings = list(raw_map["pedestrian_crossings"].values())
    lane_ids = {lane["id"] for lane in lanes}
    lane_points = [len(l["left_lane_boundary"]) + len(l["right_lane_boundary"]) + len(l["centerline"]) - 3 for l in lanes]
    crossing_points = []
    for c in crossings:
        e1 = np.array([[p["x"], p["y"], p["z"]] for p in c["edge1"]])
        e2 = np.array([[p["x"], p["y"], p["z"]] for p in c["edge2"]])
        midline = math.ceil(np.linalg.norm((e1[-1] + e2[-1]) / 2 - (e1[0] + e2[0]) / 2) / 2.0) + 1
        crossing_points.append(len(e1) - 1 + len(e2) - 1 + midline - 1)
    edges = sum(
        sum(p in lane_ids for p in l["predecessors"]) + sum(s in lane_ids for s in l["successors"])
        + (l["left_neighbor_id"] in lane_ids) + (l["right_neighbor_id"] in lane_ids)
        for l in lanes
    )
    return {
        "tracks": frame["track_id"].nunique(),
        "agents": in_history["track_id"].nunique(),
        "agent_order": list(pd.unique(in_history["track_id"])),
        "lanes": len(lanes),
        "crossings": len(crossings),
        "points_per_polygon": lane_points + crossing_points + crossing_points,
        "edges": edges,
        "frame": frame,
    }


def check_scenario(scenario_dir: Path) -> dict:
    raw = load_scenario_dir(scenario_dir)
    want = expected_counts(scenario_dir)
    agent, polygon, point = raw["agent"], raw["map_polygon"], raw["map_point"]
    A, P, M = agent["num_nodes"], polygon["num_nodes"], point["num_nodes"]

    assert raw["scenario_id"] == scenario_dir.name
    assert A == want["agents"] and agent["id"] == want["agent_order"]
    assert agent["id"][agent["av_index"]] == schema.AV_TRACK_ID
    shapes = {"type": (A,), "category": (A,), "valid_mask": (A, 110), "predict_mask": (A, 110),
              "position": (A, 110, 3), "heading": (A, 110), "velocity": (A, 110, 3)}
    for key, shape in shapes.items():
        assert agent[key].shape == shape, key
    assert agent["position"].dtype == np.float32 and agent["valid_mask"].dtype == bool
    assert agent["type"].dtype == np.uint8 and agent["category"].dtype == np.uint8

    # Masks: present rows, the vector rule on the history, predict only future of agents seen at t=49.
    frame = want["frame"]
    present = np.zeros((A, 110), bool)
    index = {track: i for i, track in enumerate(agent["id"])}
    rows = frame[frame["track_id"].isin(index)]
    present[rows["track_id"].map(index).to_numpy(), rows["timestep"].to_numpy()] = True
    valid = agent["valid_mask"]
    assert not valid[:, 0].any()
    assert np.array_equal(valid[:, 1:50], present[:, 1:50] & present[:, :49])
    assert np.array_equal(valid[:, 50:], present[:, 50:])
    predict = agent["predict_mask"]
    assert not predict[:, :50].any()
    assert np.array_equal(predict[:, 50:], present[:, 50:] & present[:, 49:50])
    focal = int(np.flatnonzero(agent["category"] == 3)[0])
    assert predict[focal, 50:].all() and valid[focal, 1:].all()
    np.testing.assert_array_equal(agent["position"][~present], 0.0)

    assert P == want["lanes"] + 2 * want["crossings"]
    assert polygon["type"][want["lanes"]:].tolist() == [schema.POLYGON_TYPES.index("PEDESTRIAN")] * (2 * want["crossings"])
    assert (polygon["is_intersection"][want["lanes"]:] == 2).all()
    assert M == sum(want["points_per_polygon"])
    edge = raw["point_to_polygon"]
    assert edge.shape == (2, M) and edge.dtype == np.int64
    assert np.array_equal(edge[0], np.arange(M))
    assert np.array_equal(np.bincount(edge[1], minlength=P), want["points_per_polygon"])
    for key in ("position", "orientation", "magnitude", "height", "type", "side"):
        assert len(point[key]) == M
    assert point["position"].shape == (M, 3) and (point["magnitude"] >= 0).all()
    assert point["type"].max() < len(schema.POINT_TYPES) and point["side"].max() < len(schema.POINT_SIDES)
    pl2pl = raw["polygon_to_polygon"]
    assert pl2pl.shape == (2, want["edges"]) and raw["polygon_to_polygon_type"].shape == (want["edges"],)
    assert pl2pl.max() < want["lanes"], "only lanes take part in polygon-to-polygon edges"
    assert set(raw["polygon_to_polygon_type"].tolist()) <= {1, 2, 3, 4}
    return raw


def test_real_fixture_converts_with_sane_counts() -> None:
    raw = check_scenario(REAL_DIR)
    want = expected_counts(REAL_DIR)
    # The fixture README: 58 tracks, 71 lane segments, 6 pedestrian crossings.
    assert (want["tracks"], want["lanes"], want["crossings"]) == (58, 71, 6)
    assert raw["map_polygon"]["num_nodes"] == 71 + 12
    assert raw["city"] == "austin"


def test_real_fixture_crosswalk_directions_are_reverses() -> None:
    raw = load_scenario_dir(REAL_DIR)
    lanes, polygon = 71, raw["map_polygon"]
    forward, backward = slice(lanes, lanes + 6), slice(lanes + 6, lanes + 12)
    turn = np.angle(np.exp(1j * (polygon["orientation"][forward] - polygon["orientation"][backward])))
    np.testing.assert_allclose(np.abs(turn), np.pi, atol=1e-4)
    np.testing.assert_allclose(polygon["height"][forward], -polygon["height"][backward], atol=1e-5)


def test_generated_scenarios_convert_with_sane_counts(mini_root: Path) -> None:
    for split in ("train", "val"):
        for scenario_dir in sorted((mini_root / split).iterdir())[:6]:
            raw = check_scenario(scenario_dir)
            assert 5 <= raw["agent"]["num_nodes"] <= 40
            assert 25 <= raw["map_polygon"]["num_nodes"] <= 70


def test_test_split_rule_predicts_scored_agents_without_future(tmp_path: Path) -> None:
    scenario_dir = tmp_path / REAL_DIR.name
    shutil.copytree(REAL_DIR, scenario_dir)
    parquet = scenario_dir / f"scenario_{REAL_DIR.name}.parquet"
    frame = pd.read_parquet(parquet)
    frame[frame["timestep"] < 50].reset_index(drop=True).to_parquet(parquet)
    raw = load_scenario_dir(scenario_dir)
    agent = raw["agent"]
    current = np.isin(np.arange(agent["num_nodes"]), np.flatnonzero(agent["valid_mask"][:, 49]))
    scored = current | (agent["category"] >= 2)
    assert agent["predict_mask"][scored, 50:].all() and not agent["predict_mask"][~scored].any()


# --- errors ---------------------------------------------------------------------------------
def test_missing_directory_and_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_scenario_dir(tmp_path / "nope")
    scenario_dir = tmp_path / REAL_DIR.name
    shutil.copytree(REAL_DIR, scenario_dir)
    (scenario_dir / f"log_map_archive_{REAL_DIR.name}.json").unlink()
    with pytest.raises(FileNotFoundError, match=f"log_map_archive_{REAL_DIR.name}.json"):
        load_scenario_dir(scenario_dir)
    (scenario_dir / f"scenario_{REAL_DIR.name}.parquet").rename(scenario_dir / "renamed.parquet")
    with pytest.raises(FileNotFoundError, match=f"scenario_{REAL_DIR.name}.parquet"):
        load_scenario_dir(scenario_dir)


def test_corrupt_files_give_one_line_errors(tmp_path: Path) -> None:
    scenario_dir = tmp_path / REAL_DIR.name
    shutil.copytree(REAL_DIR, scenario_dir)
    parquet = scenario_dir / f"scenario_{REAL_DIR.name}.parquet"
    good = parquet.read_bytes()
    parquet.write_bytes(good[: len(good) // 2])
    with pytest.raises(Argoverse2FormatError, match="cannot read .*scenario_.*parquet") as error:
        load_scenario_dir(scenario_dir)
    assert "\n" not in str(error.value)

    pd.DataFrame({"a": [1, 2]}).to_parquet(parquet)
    with pytest.raises(Argoverse2FormatError, match="lacks the Argoverse 2 scenario columns track_id"):
        load_scenario_dir(scenario_dir)

    parquet.write_bytes(good)
    map_json = scenario_dir / f"log_map_archive_{REAL_DIR.name}.json"
    map_json.write_text('{"lane_segments": {"1": {"id": 1}}')
    with pytest.raises(Argoverse2FormatError, match="cannot read .*log_map_archive_.*as an Argoverse 2 map") as error:
        load_scenario_dir(scenario_dir)
    assert "\n" not in str(error.value)
