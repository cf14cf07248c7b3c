"""The embedded Argoverse 2 data moves like traffic and carries structure a model can learn."""

from __future__ import annotations

import numpy as np
import pytest

from drivebench.data.argoverse2 import schema
from drivebench.data.argoverse2.generate import generate_av2
from drivebench.data.argoverse2.scenario import load_scenario_dir

VEHICLE_TYPES = [schema.AGENT_TYPES.index("vehicle"), schema.AGENT_TYPES.index("bus")]
CENTERLINE = schema.POINT_TYPES.index("CENTERLINE")
LANE_TYPES = [schema.POLYGON_TYPES.index(t) for t in ("VEHICLE", "BIKE", "BUS")]


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    root = generate_av2(tmp_path_factory.mktemp("av2") / "mini", size="mini", seed=0, workers=0, progress=False)
    return [load_scenario_dir(d) for split in ("train", "val") for d in sorted((root / split).iterdir())]


def present(agent: dict) -> np.ndarray:
    """Steps with a parquet row: missing steps are zeros, and city coordinates are never 0."""
    return np.any(agent["position"][..., :2] != 0.0, axis=-1)


def test_velocity_matches_position_differences_at_10hz(scenarios: list[dict]) -> None:
    errors = []
    for raw in scenarios:
        agent = raw["agent"]
        rows = present(agent)
        inner = rows[:, :-2] & rows[:, 1:-1] & rows[:, 2:]
        position = agent["position"][..., :2].astype(np.float64)
        central = (position[:, 2:] - position[:, :-2]) / (2 * schema.STEP_SECONDS)
        errors.append(np.linalg.norm(central - agent["velocity"][:, 1:-1, :2], axis=-1)[inner])
    errors = np.concatenate(errors)
    assert len(errors) > 10_000
    assert np.percentile(errors, 99) < 0.05 and errors.max() < 0.2


def test_heading_is_the_direction_of_motion_for_moving_vehicles(scenarios: list[dict]) -> None:
    deviations = []
    for raw in scenarios:
        agent = raw["agent"]
        velocity = agent["velocity"][..., :2]
        moving = present(agent) & (np.linalg.norm(velocity, axis=-1) > 2.0) & np.isin(agent["type"], VEHICLE_TYPES)[:, None]
        motion = np.arctan2(velocity[..., 1], velocity[..., 0])
        deviations.append(np.abs(np.angle(np.exp(1j * (agent["heading"] - motion))))[moving])
    deviations = np.concatenate(deviations)
    assert len(deviations) > 5_000
    assert np.degrees(deviations.max()) < 2.0


def test_tracks_av_focal_and_categories(scenarios: list[dict]) -> None:
    appear_late = disappear_early = 0
    for raw in scenarios:
        agent = raw["agent"]
        rows = present(agent)
        assert rows[agent["av_index"]].all(), "the AV is tracked for all 110 steps"
        focal = np.flatnonzero(agent["category"] == 3)
        assert len(focal) == 1 and rows[focal[0]].all(), "one focal track, present all 110 steps"
        assert agent["type"][focal[0]] in VEHICLE_TYPES and np.linalg.norm(agent["velocity"][focal[0]], axis=-1).max() > 1
        full = rows.all(axis=1)
        assert full[agent["category"] >= 1].all() and not full[agent["category"] == 0].any()
        appear_late += int((~rows[:, 0]).sum())
        disappear_early += int((~rows[:, -1]).sum())
    categories = np.concatenate([raw["agent"]["category"] for raw in scenarios])
    assert {0, 1, 2, 3} <= set(categories.tolist())
    assert appear_late > 0 and disappear_early > 0, "fragments should appear and disappear mid-scenario"
    types = set(np.concatenate([raw["agent"]["type"] for raw in scenarios]).tolist())
    assert {schema.AGENT_TYPES.index(t) for t in ("vehicle", "pedestrian", "static")} <= types


def centerline_distance(raw: dict, points: np.ndarray) -> np.ndarray:
    """Distance of each point (N, 2) to the nearest lane centerline segment."""
    point = raw["map_point"]
    polygon_of_point = raw["point_to_polygon"][1]
    is_lane_center = (point["type"] == CENTERLINE) & np.isin(raw["map_polygon"]["type"][polygon_of_point], LANE_TYPES)
    start = point["position"][is_lane_center, :2].astype(np.float64)
    angle, length = point["orientation"][is_lane_center], point["magnitude"][is_lane_center]
    vector = np.stack([np.cos(angle), np.sin(angle)], axis=-1) * length[:, None]
    relative = points[:, None, :] - start[None]
    t = np.clip((relative * vector).sum(-1) / np.maximum(length**2, 1e-9), 0.0, 1.0)
    return np.linalg.norm(relative - t[..., None] * vector[None], axis=-1).min(axis=1)


def test_moving_vehicles_stay_near_lane_centerlines(scenarios: list[dict]) -> None:
    distances = []
    for raw in scenarios[:20]:
        agent = raw["agent"]
        speed = np.linalg.norm(agent["velocity"][..., :2], axis=-1)
        moving = present(agent) & (speed > 1.0) & np.isin(agent["type"], VEHICLE_TYPES)[:, None]
        distances.append(centerline_distance(raw, agent["position"][..., :2][moving].astype(np.float64)))
    distances = np.concatenate(distances)
    assert np.median(distances) < 0.2
    assert np.percentile(distances, 95) < 0.5  # lane changes and the map's edges make the tail


def test_constant_velocity_misses_turns_much_more_than_straight_driving(scenarios: list[dict]) -> None:
    """The future depends on the map: extrapolating the focal agent at t=4.9 s straight ahead
    fails by far more when the agent turns than when it keeps its heading."""
    turning, straight = [], []
    now, horizon = schema.NUM_HISTORICAL_STEPS - 1, np.arange(1, schema.NUM_FUTURE_STEPS + 1)
    for raw in scenarios:
        agent = raw["agent"]
        focal = int(np.flatnonzero(agent["category"] == 3)[0])
        position = agent["position"][focal, :, :2].astype(np.float64)
        guess = position[now] + agent["velocity"][focal, now, :2] * (horizon[:, None] * schema.STEP_SECONDS)
        final_error = float(np.linalg.norm(guess[-1] - position[-1]))
        turn = abs(np.angle(np.exp(1j * (agent["heading"][focal, -1] - agent["heading"][focal, now]))))
        (turning if turn > np.radians(30) else straight).append(final_error)
    assert len(turning) >= 5 and len(straight) >= 5, (len(turning), len(straight))
    assert np.mean(turning) > 1.5 * np.mean(straight), (np.mean(turning), np.mean(straight))
    assert np.mean(turning) > 10.0


def test_accelerations_are_plausible(scenarios: list[dict]) -> None:
    lateral, longitudinal = [], []
    for raw in scenarios:
        agent = raw["agent"]
        rows = present(agent)
        speed = np.linalg.norm(agent["velocity"][..., :2], axis=-1)
        moving = rows[:, 1:] & rows[:, :-1] & (speed[:, 1:] > 2.0) & np.isin(agent["type"], VEHICLE_TYPES)[:, None]
        yaw_rate = np.angle(np.exp(1j * np.diff(agent["heading"], axis=1))) / schema.STEP_SECONDS
        lateral.append(np.abs(speed[:, 1:] * yaw_rate)[moving])
        longitudinal.append(np.abs(np.diff(speed, axis=1) / schema.STEP_SECONDS)[moving])
    lateral, longitudinal = np.concatenate(lateral), np.concatenate(longitudinal)
    assert np.percentile(lateral, 99) < 4.0 and lateral.max() < 6.0
    assert np.percentile(longitudinal, 99) < 5.0 and longitudinal.max() < 6.0


def lane_graph(raw: dict) -> tuple[dict[int, set[int]], np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Lanes one can drive into from each lane (successors and side neighbours), plus the lane
    centerline vectors (start, direction, length, polygon) to locate agents on lanes."""
    follow: dict[int, set[int]] = {}
    edges, kinds = raw["polygon_to_polygon"], raw["polygon_to_polygon_type"]
    for source, target, kind in zip(edges[0], edges[1], kinds):
        if schema.POLYGON_TO_POLYGON_TYPES[kind] in ("SUCC", "LEFT", "RIGHT"):
            follow.setdefault(int(target), set()).add(int(source))
    point = raw["map_point"]
    polygon_of_point = raw["point_to_polygon"][1]
    keep = (point["type"] == CENTERLINE) & np.isin(raw["map_polygon"]["type"][polygon_of_point], LANE_TYPES)
    direction = np.stack([np.cos(point["orientation"][keep]), np.sin(point["orientation"][keep])], axis=-1)
    return follow, point["position"][keep, :2].astype(np.float64), direction, point["magnitude"][keep], polygon_of_point[keep]


def lanes_at(graph: tuple, position: np.ndarray, heading: float, radius: float = 1.5) -> set[int]:
    """Lanes whose centerline passes within ``radius`` of ``position`` in the agent's direction."""
    _, start, direction, length, polygon = graph
    relative = position[None] - start
    t = np.clip((relative * direction).sum(-1), 0.0, length)
    distance = np.linalg.norm(relative - t[:, None] * direction, axis=-1)
    aligned = (direction @ np.array([np.cos(heading), np.sin(heading)])) > np.cos(np.radians(50))
    return set(polygon[(distance < radius) & aligned].tolist())


def test_focal_futures_follow_the_lane_graph(scenarios: list[dict]) -> None:
    """The map determines where the focal agent can go: its final position lies on a lane that
    the lane graph (successors, lane changes) reaches from the lane it drives on at t=4.9 s."""
    now = schema.NUM_HISTORICAL_STEPS - 1
    on_graph = checked = 0
    for raw in scenarios:
        agent = raw["agent"]
        focal = int(np.flatnonzero(agent["category"] == 3)[0])
        position = agent["position"][focal, :, :2].astype(np.float64)
        if np.linalg.norm(position[-1] - position[now]) < 5.0:
            continue  # standing still: nothing to test
        graph = lane_graph(raw)
        frontier = lanes_at(graph, position[now], float(agent["heading"][focal, now]))
        final = lanes_at(graph, position[-1], float(agent["heading"][focal, -1]))
        if not frontier or not final:
            continue  # at the edge of the map
        reachable = set(frontier)
        for _ in range(10):
            frontier = {nxt for lane in frontier for nxt in graph[0].get(lane, ())} - reachable
            reachable |= frontier
        checked += 1
        on_graph += bool(final & reachable)
    assert checked >= 20
    assert on_graph >= 0.95 * checked, (on_graph, checked)
