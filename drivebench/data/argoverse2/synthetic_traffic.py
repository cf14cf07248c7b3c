"""Agents of one synthetic scenario: who is where over 11 s, and what a tracker would have seen.

Why: a forecasting model can only learn what the history and the map determine, so vehicles
follow routes on the lane graph (``vehicle_routes``) under car following and right of way
(``vehicle_simulation``); pedestrians walk across crosswalks and along sidewalks, cyclists ride
bike lanes, parked cars and static objects stand still. Visibility is a range around the AV; the
longest visible run of each agent becomes its track, which yields fragments that appear and
disappear, like real tracker output. Categories follow Argoverse 2: the AV is unscored, one
moving vehicle tracked for all 110 steps is focal, nearby fully tracked movers are scored.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from drivebench.data.argoverse2 import schema
from drivebench.data.argoverse2.synthetic_map import RoadNetwork
from drivebench.data.argoverse2.vehicle_routes import build_path, plan_route
from drivebench.data.argoverse2.vehicle_simulation import (
    DT,
    T,
    SimulatedAgent,
    VehicleSpec,
    simulate_vehicles,
    vehicle_params,
)

MIN_TRACK_STEPS = 10


@dataclass(frozen=True)
class TrafficSize:
    """Knobs that set how many agents of each kind a scenario has."""

    queue_prob: float  # chance that a lane entering the map carries a queue of vehicles
    departure_queue_prob: float  # same, for lanes leaving an intersection
    headway: tuple[float, float]  # seconds between queued vehicles: minimum, mean of the random extra
    pedestrians: tuple[int, int]
    cyclists: tuple[int, int]
    parked: tuple[int, int]
    static: tuple[int, int]
    view_radius: tuple[float, float]  # metres around the AV in which agents are tracked
    max_scored: int


@dataclass
class Track:
    """One agent as it goes into the parquet (local frame; ``format_writer`` maps to the city)."""

    track_id: str
    object_type: str
    category: int
    steps: np.ndarray  # (n,) int
    position: np.ndarray  # (n, 2)
    heading: np.ndarray  # (n,)
    velocity: np.ndarray  # (n, 2)


# --- vehicles ---------------------------------------------------------------------------
def _queue_positions(rng: np.random.Generator, top: float, bottom: float, headway: tuple[float, float]) -> list[float]:
    """Positions (path metres) of a queue from ``top`` backwards, spaced by speed x headway.

    Headways are a minimum plus an exponential extra, so traffic comes in platoons with gaps
    (a side road can find a gap to enter)."""
    positions = []
    s = top
    while s > bottom:
        positions.append(s)
        s -= 7.0 + 11.0 * min(headway[0] + rng.exponential(headway[1]), 10.0)
    return positions


def _spawn_vehicles(net: RoadNetwork, rng: np.random.Generator, size: TrafficSize) -> list[VehicleSpec]:
    vehicles: list[VehicleSpec] = []

    def add(start_lane: int, object_type: str, along: float) -> None:
        path = build_path(net, plan_route(net, rng, start_lane))
        vehicles.append(VehicleSpec(object_type=object_type, path=path, s0=path.map_start + along,
                                 **vehicle_params(rng, object_type)))

    def vehicle_type() -> str:
        return str(rng.choice(["vehicle", "bus", "motorcyclist"], p=[0.93, 0.04, 0.03]))

    for lane in net.entry_lanes:
        if rng.random() < size.queue_prob:
            road_part = net.lanes[lane].length * rng.uniform(0.5, 2.5)
            for along in _queue_positions(rng, road_part, -60.0, size.headway):
                add(lane, vehicle_type(), along)
    for lane in net.departure_lanes:
        if rng.random() < size.departure_queue_prob:
            for along in _queue_positions(rng, rng.uniform(20.0, 60.0), 5.0, size.headway):
                add(lane, vehicle_type(), along)
    n_cyclists = int(rng.integers(size.cyclists[0], size.cyclists[1] + 1))
    bike_starts = net.bike_entry_lanes or [lane for lane in net.entry_lanes
                                           if net.lanes[lane].slot == net.roads[net.lanes[lane].road].n_lanes - 1]
    for _ in range(n_cyclists if bike_starts else 0):
        add(int(rng.choice(bike_starts)), "cyclist", float(rng.uniform(-40.0, 60.0)))
    return vehicles


# --- other agents -------------------------------------------------------------------------
def _walker(rng: np.random.Generator, path: np.ndarray, object_type: str = "pedestrian") -> SimulatedAgent:
    """Walks along a dense path at a steady pace, starting anywhere along it."""
    seg = np.hypot(*np.diff(path, axis=0).T)
    cum = np.concatenate([[0.0], np.cumsum(seg)])
    speed = rng.uniform(1.0, 1.6)
    t = np.arange(T) * DT
    wobble = 0.08 * np.sin(2 * np.pi * t / rng.uniform(3.0, 8.0) + rng.uniform(0, 6.3))
    s = rng.uniform(-10.0, cum[-1] - 5.0) + speed * t + wobble
    s = np.clip(s, 0.0, cum[-1])
    position = np.stack([np.interp(s, cum, path[:, 0]), np.interp(s, cum, path[:, 1])], axis=-1)
    velocity = np.gradient(position, DT, axis=0)
    moving_speed = np.hypot(velocity[:, 0], velocity[:, 1])
    heading = np.arctan2(velocity[:, 1], velocity[:, 0])
    index = np.clip(np.searchsorted(cum, s) - 1, 0, len(path) - 2)
    path_heading = np.arctan2(*(path[index + 1] - path[index]).T[::-1])
    heading = np.where(moving_speed > 0.2, heading, path_heading)
    return SimulatedAgent(object_type=object_type, position=position, heading=heading, velocity=velocity,
                          in_map=np.ones(T, bool), moving=bool(s[-1] - s[0] > 2.0))


def _standing(position: np.ndarray, heading: float, object_type: str) -> SimulatedAgent:
    return SimulatedAgent(object_type=object_type, position=np.repeat(position[None], T, axis=0),
                          heading=np.full(T, heading), velocity=np.zeros((T, 2)), in_map=np.ones(T, bool),
                          moving=False)


def _other_agents(net: RoadNetwork, rng: np.random.Generator, size: TrafficSize) -> list[SimulatedAgent]:
    agents: list[SimulatedAgent] = []
    for _ in range(int(rng.integers(size.pedestrians[0], size.pedestrians[1] + 1))):
        kind = rng.random()
        if kind < 0.5 and net.crosswalks:
            agents.append(_walker(rng, net.crosswalks[int(rng.integers(len(net.crosswalks)))].walk_path))
        elif kind < 0.85:
            sidewalk = net.sidewalks[int(rng.integers(len(net.sidewalks)))]
            agents.append(_walker(rng, sidewalk if rng.random() < 0.5 else sidewalk[::-1]))
        else:
            sidewalk = net.sidewalks[int(rng.integers(len(net.sidewalks)))]
            agents.append(_standing(sidewalk[int(rng.integers(len(sidewalk)))], rng.uniform(-np.pi, np.pi), "pedestrian"))
    n_parked = min(len(net.curb_spots), int(rng.integers(size.parked[0], size.parked[1] + 1)))
    for i in rng.choice(len(net.curb_spots), size=n_parked, replace=False):
        position, heading = net.curb_spots[int(i)]
        agents.append(_standing(position, heading, "vehicle"))
    n_static = min(len(net.roadside_spots), int(rng.integers(size.static[0], size.static[1] + 1)))
    kinds = ["static", "construction", "background", "riderless_bicycle", "unknown"]
    for i in rng.choice(len(net.roadside_spots), size=n_static, replace=False):
        kind = str(rng.choice(kinds, p=[0.45, 0.15, 0.2, 0.15, 0.05]))
        agents.append(_standing(net.roadside_spots[int(i)], rng.uniform(-np.pi, np.pi), kind))
    return agents


# --- observation: AV, visibility, categories -----------------------------------------------
def _longest_run(mask: np.ndarray) -> tuple[int, int]:
    """[start, stop) of the longest run of True (0, 0 if none)."""
    padded = np.concatenate([[False], mask, [False]])
    edges = np.flatnonzero(padded[1:] != padded[:-1])
    if len(edges) == 0:
        return 0, 0
    starts, stops = edges[0::2], edges[1::2]
    best = int(np.argmax(stops - starts))
    return int(starts[best]), int(stops[best])


def _pick_av(agents: list[SimulatedAgent], net: RoadNetwork, rng: np.random.Generator) -> int | None:
    candidates = []
    for i, agent in enumerate(agents):
        if agent.is_vehicle_sim and agent.object_type == "vehicle" and agent.moving and agent.in_map.all():
            near_node = np.min(np.linalg.norm(net.nodes - agent.position[schema.NUM_HISTORICAL_STEPS - 1], axis=1))
            candidates.append((i, near_node < 70.0))
    if not candidates:
        return None
    preferred = [i for i, near in candidates if near] or [i for i, _ in candidates]
    return int(rng.choice(preferred))


def observe(agents: list[SimulatedAgent], av: int, net: RoadNetwork, rng: np.random.Generator,
            size: TrafficSize) -> list[Track] | None:
    """Tracks as a tracker on the AV sees them; None if no agent can be the focal track."""
    radius = rng.uniform(*size.view_radius)
    av_position = agents[av].position
    runs: dict[int, tuple[int, int]] = {}
    for i, agent in enumerate(agents):
        if i == av:
            runs[i] = (0, T)
            continue
        visible = (np.linalg.norm(agent.position - av_position, axis=1) <= radius) & agent.in_map
        start, stop = _longest_run(visible)
        if stop - start >= MIN_TRACK_STEPS:
            runs[i] = (start, stop)
    full = [i for i, (a, b) in runs.items() if i != av and a == 0 and b == T]
    focal_pool = [i for i in full if agents[i].is_vehicle_sim and agents[i].moving
                  and agents[i].object_type in ("vehicle", "bus")]
    if not focal_pool:
        return None
    now = schema.NUM_HISTORICAL_STEPS - 1
    # Like Argoverse's focal tracks: moving at the present step where possible, often turning.
    in_motion = [i for i in focal_pool if np.hypot(*agents[i].velocity[now]) > 1.0] or focal_pool
    turning = [i for i in in_motion if agents[i].turns_in_future]
    focal = int(rng.choice(turning if turning and rng.random() < 0.5 else in_motion))
    scored_pool = sorted(
        (i for i in full if i != focal and agents[i].moving),
        key=lambda i: float(np.linalg.norm(agents[i].position[now] - agents[focal].position[now])),
    )[: size.max_scored]

    order = sorted((i for i in runs if i != av), key=lambda i: (runs[i][0], rng.random()))
    next_id = int(rng.integers(10_000, 900_000))
    tracks: list[Track] = []
    for i in order + [av]:
        start, stop = runs[i]
        if i == av:
            track_id, category = schema.AV_TRACK_ID, 1
        else:
            next_id += int(rng.integers(1, 60))
            track_id = str(next_id)
            category = 3 if i == focal else 2 if i in scored_pool else 1 if (start, stop) == (0, T) else 0
        agent = agents[i]
        tracks.append(Track(track_id=track_id, object_type=agent.object_type, category=category,
                            steps=np.arange(start, stop), position=agent.position[start:stop],
                            heading=agent.heading[start:stop], velocity=agent.velocity[start:stop]))
    return tracks


def generate_tracks(net: RoadNetwork, rng: np.random.Generator, size: TrafficSize) -> list[Track] | None:
    """All tracks of a scenario on ``net``; None when this draw has no usable AV or focal agent."""
    vehicles = _spawn_vehicles(net, rng, size)
    agents = simulate_vehicles(net, vehicles, rng) + _other_agents(net, rng, size)
    av = _pick_av(agents, net, rng)
    if av is None:
        return None
    return observe(agents, av, net, rng, size)
