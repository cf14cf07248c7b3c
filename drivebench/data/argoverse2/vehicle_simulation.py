"""Vehicle simulation: IDM car following plus right-of-way at intersections, all vehicles at once.

Why this shape: speed follows a profile set by the curvature ahead (vehicles slow before a turn,
visibly in the history when the turn is near) and by car following (a braking leader is visible
too). At intersections side-road vehicles and main-road left turns yield: a driver waits at the
stop line while a crossing connector is taken or a vehicle with the right of way arrives within
GAP_ACCEPTANCE. Positions come from the simulation; velocity is their central difference at
10 Hz and heading the direction of motion, so the kinematics are consistent by construction.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from drivebench.data.argoverse2 import schema
from drivebench.data.argoverse2.synthetic_map import RoadNetwork
from drivebench.data.argoverse2.vehicle_routes import VehiclePath, desired_speeds

DT = schema.STEP_SECONDS
T = schema.NUM_STEPS
WARMUP_STEPS = 20
REACTION_STEPS = 3  # drivers re-assess who they follow every 0.3 s
MAX_BRAKE = 4.5  # m/s^2; firmer braking is rare in real traffic
NOT_ON_PATH = -1e9  # lane start of a lane that is not on a vehicle's path
CYCLIST_KERB_OFFSET = 1.0  # metres right of a car lane's centre
GAP_ACCEPTANCE = 3.0  # seconds: a yielding driver enters when the next priority car is further off


@dataclass
class SimulatedAgent:
    """Full 110-step state of one simulated agent, before visibility is applied."""

    object_type: str
    position: np.ndarray  # (T, 2)
    heading: np.ndarray  # (T,)
    velocity: np.ndarray  # (T, 2)
    in_map: np.ndarray  # (T,) bool
    moving: bool
    is_vehicle_sim: bool = False
    turns_in_future: bool = False


@dataclass
class VehicleSpec:
    """One vehicle (or cyclist) to simulate: its path, start position and driver parameters."""

    object_type: str
    path: VehiclePath
    s0: float
    cruise: float
    length: float
    max_accel: float
    headway: float
    lateral_accel: float


def vehicle_params(rng: np.random.Generator, object_type: str) -> dict[str, float]:
    """Driver parameters by kind: speeds in m/s, accelerations in m/s^2, headway in s."""
    if object_type == "cyclist":
        return {"cruise": rng.uniform(3.5, 6.5), "length": 1.8, "max_accel": rng.uniform(0.6, 1.0),
                "headway": rng.uniform(1.0, 1.6), "lateral_accel": rng.uniform(1.5, 2.2)}
    if object_type == "bus":
        return {"cruise": rng.uniform(8.0, 11.0), "length": 12.0, "max_accel": rng.uniform(0.7, 1.1),
                "headway": rng.uniform(1.6, 2.2), "lateral_accel": rng.uniform(1.2, 1.8)}
    return {"cruise": rng.uniform(9.0, 15.0), "length": rng.uniform(4.2, 5.2), "max_accel": rng.uniform(1.2, 2.2),
            "headway": rng.uniform(1.0, 1.8), "lateral_accel": rng.uniform(1.8, 2.8)}


def simulate_vehicles(net: RoadNetwork, vehicles: list[VehicleSpec],
                      rng: np.random.Generator) -> list[SimulatedAgent]:
    """IDM car following along each vehicle's path, all vehicles stepped together."""
    if not vehicles:
        return []
    n = len(vehicles)
    n_lanes = len(net.lanes)
    sizes = np.array([len(v.path.xy) for v in vehicles])
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    xy_all = np.concatenate([v.path.xy for v in vehicles])
    lane_all = np.concatenate([v.path.lane for v in vehicles])
    speed_all = desired_speeds([v.path.xy for v in vehicles], np.array([v.cruise for v in vehicles]),
                               np.array([v.lateral_accel for v in vehicles]), comfort_brake=1.8)
    next_lane_all = np.concatenate([v.path.next_lane for v in vehicles])
    next_start_all = np.concatenate([v.path.next_start for v in vehicles])
    lane_start = np.full((n, 3 * n_lanes + 1), NOT_ON_PATH)  # last column: "no lane"
    for i, v in enumerate(vehicles):
        ids = np.fromiter(v.path.lane_start.keys(), dtype=np.int64)
        lane_start[i, ids] = np.fromiter(v.path.lane_start.values(), dtype=np.float64)

    compact, conflicts, priority, clear_of = connector_conflicts(net)
    no_connector = conflicts.shape[0] - 1
    length = np.array([v.length for v in vehicles])
    max_accel = np.array([v.max_accel for v in vehicles])
    headway = np.array([v.headway for v in vehicles])
    s = np.array([v.s0 for v in vehicles], dtype=np.float64)
    limit = (sizes - 2).astype(np.float64)
    last_index = sizes - 1
    v_now = speed_all[offsets + np.clip(s.astype(int), 0, sizes - 1)] * rng.uniform(0.85, 1.0, n)
    accel = np.zeros(n)
    rows = np.arange(n)
    # Nobody follows themselves, and cars overtake cyclists (they ride at the lane's right edge).
    not_self = ~np.eye(n, dtype=bool)
    is_cyclist = np.array([v.object_type == "cyclist" for v in vehicles])
    not_self[np.ix_(~is_cyclist, is_cyclist)] = False
    half_lengths = 0.5 * (length[:, None] + length[None, :])
    brake_term = 2 * np.sqrt(max_accel * 2.0)  # IDM comfortable deceleration 2 m/s^2
    leader = rows.copy()
    history = np.empty((T, n))
    blocked = np.zeros(n, dtype=bool)
    any_blocked = False
    occupied = np.zeros(no_connector + 1, dtype=bool)
    arriving = np.zeros(no_connector + 1, dtype=bool)
    for step in range(WARMUP_STEPS + T):
        index = offsets + s.astype(int)  # 0 <= s <= limit: always on the path
        look = offsets + np.minimum((s + v_now).astype(int), last_index)  # one second ahead
        a_free = np.minimum(np.maximum(0.8 * (np.minimum(speed_all[look], speed_all[index]) - v_now), -4.0), max_accel)
        lane_now = lane_all[index]
        next_lane = next_lane_all[index]
        along = s - lane_start[rows, lane_now]
        to_next = next_start_all[index] - s
        if step % REACTION_STEPS == 0:
            # Who is ahead on my path: j's position on i's path from the lane j is on, or, for a
            # j about to merge into my path, from the lane it enters next (zipper merge). Lanes
            # off i's path sit at NOT_ON_PATH, which makes the gap hugely negative.
            ahead = np.maximum(lane_start[:, lane_now] + along, lane_start[:, next_lane] - to_next)
            gap = ahead - s[:, None] - half_lengths
            gap[(gap <= -1.0) | ~not_self] = np.inf
            leader = np.argmin(gap, axis=1)
            # Intersections: wait at the stop line while a crossing connector is taken (a vehicle
            # on it, or one too close to stop before it), or while a vehicle with the right of
            # way will reach a crossing connector within GAP_ACCEPTANCE. Whoever cannot stop goes.
            committed = (v_now > 2.0) & (to_next < v_now * v_now / (2 * MAX_BRAKE) + 1.0)
            on_connector = compact[lane_now]
            wants = np.where(on_connector == no_connector, compact[next_lane], no_connector)
            # A vehicle on a connector blocks a crossing one until it is past the conflict point.
            in_the_way = conflicts[wants][:, on_connector] & (along[None, :] < clear_of[on_connector][:, wants].T)
            occupied[:] = False
            occupied[wants[committed]] = True
            arriving[:] = False
            arriving[wants[(v_now > 1.0) & (to_next < GAP_ACCEPTANCE * v_now)]] = True
            occupied[no_connector] = arriving[no_connector] = False
            crossing = conflicts[wants]
            must_yield = (in_the_way.any(1) | (crossing & occupied).any(1)
                          | (crossing & arriving & (priority > priority[wants][:, None])).any(1))
            blocked = (wants != no_connector) & ~committed & (to_next < 60.0) & must_yield
            any_blocked = bool(blocked.any())
        leader_gap = np.maximum(lane_start[rows, lane_now[leader]] + along[leader],
                                lane_start[rows, next_lane[leader]] - to_next[leader]) - s - half_lengths[rows, leader]
        follows = (leader_gap > -1.0) & (leader_gap < 150.0) & (leader != rows)
        desired_gap = np.maximum(2.5 + v_now * headway + v_now * (v_now - v_now[leader]) / brake_term, 0.0)
        a_follow = max_accel * (1 - (desired_gap / np.clip(leader_gap, 0.5, None)) ** 2)
        command = np.where(follows, np.minimum(a_free, a_follow), a_free)
        if any_blocked:  # a standing obstacle at the stop line
            stop_gap = np.maximum(to_next - 1.5, 0.3)
            a_stop = max_accel * (1 - ((1.0 + v_now * headway + v_now * v_now / brake_term) / stop_gap) ** 2)
            command = np.where(blocked, np.minimum(command, a_stop), command)
        command = np.minimum(np.maximum(command, -MAX_BRAKE), max_accel)
        accel += 0.5 * (command - accel)  # finite jerk
        v_now = np.maximum(v_now + accel * DT, 0.0)
        s = np.minimum(s + v_now * DT, limit)
        if step >= WARMUP_STEPS:
            history[step - WARMUP_STEPS] = s

    # Positions on the paths, plus a gentle sway around the centerline that depends on the
    # distance driven (none while stopped). All vehicles at once: arrays are (T, n, ...).
    base = np.clip(history.astype(int), 0, sizes - 2)
    frac = (history - base)[..., None]
    p0, p1 = xy_all[offsets + base], xy_all[offsets + base + 1]
    tangent = p1 - p0
    tangent_heading = np.arctan2(tangent[..., 1], tangent[..., 0])
    amplitude, wavelength, phase = rng.uniform(0.0, 0.12, n), rng.uniform(40.0, 120.0, n), rng.uniform(0.0, 6.3, n)
    sway = amplitude * np.sin(2 * np.pi * history / wavelength + phase)
    on_car_lane = is_cyclist & np.array([net.lanes[v.path.lane[int(v.path.map_start)]].lane_type != "BIKE"
                                         for v in vehicles])
    sway = sway - CYCLIST_KERB_OFFSET * on_car_lane  # cyclists without a bike lane keep right
    normal = np.stack([-np.sin(tangent_heading), np.cos(tangent_heading)], axis=-1)
    position = p0 + frac * tangent + sway[..., None] * normal
    velocity = np.gradient(position, DT, axis=0)
    speed = np.hypot(velocity[..., 0], velocity[..., 1])
    heading = np.where(speed > 0.5, np.arctan2(velocity[..., 1], velocity[..., 0]), tangent_heading)
    map_start = np.array([v.path.map_start for v in vehicles])
    map_end = np.array([v.path.map_end for v in vehicles])
    in_map = (history >= map_start - 5.0) & (history <= map_end + 5.0)
    turning_all = np.concatenate([v.path.maneuvers for v in vehicles])
    turns_in_future = turning_all[offsets + base[schema.NUM_HISTORICAL_STEPS:]].any(axis=0)
    moving = history[-1] - history[0] > 5.0
    return [
        SimulatedAgent(object_type=vehicle.object_type, position=position[:, i], heading=heading[:, i],
                       velocity=velocity[:, i], in_map=in_map[:, i], moving=bool(moving[i]), is_vehicle_sim=True,
                       turns_in_future=bool(turns_in_future[i]))
        for i, vehicle in enumerate(vehicles)
    ]


def connector_conflicts(net: RoadNetwork) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Which intersection lanes cross or merge (centerlines closer than 2.5 m, different sources).

    Returns a compact index per lane id (path lane ids, virtual ones included; non-connectors
    map to the last slot), a (C+1, C+1) boolean conflict matrix whose last row/column is False,
    each connector's right-of-way priority (last slot: -1), and ``clear_of[a, b]``: how far
    along connector a (metres) a vehicle must be to have passed its conflict with b.
    """
    connectors = [lane for lane in net.lanes if lane.is_intersection]
    count = len(connectors)
    compact = np.full(3 * len(net.lanes) + 1, count)
    compact[[lane.index for lane in connectors]] = np.arange(count)
    conflicts = np.zeros((count + 1, count + 1), dtype=bool)
    clear_of = np.zeros((count + 1, count + 1))
    priority = np.array([lane.priority for lane in connectors] + [-1])
    if count < 2:
        return compact, conflicts, priority, clear_of
    from scipy.spatial import cKDTree

    stride = 2  # dense points are 1 m apart
    samples = [lane.center[::stride] for lane in connectors]
    owner = np.repeat(np.arange(count), [len(p) for p in samples])
    along = np.concatenate([np.arange(len(p)) * float(stride) for p in samples])
    close = cKDTree(np.concatenate(samples)).query_pairs(2.5, output_type="ndarray")
    a, b = owner[close[:, 0]], owner[close[:, 1]]
    conflicts[a, b] = conflicts[b, a] = True
    np.maximum.at(clear_of, (a, b), along[close[:, 0]])
    np.maximum.at(clear_of, (b, a), along[close[:, 1]])
    clear_of += 6.0  # the vehicle's length past the last close point
    source = np.array([lane.predecessors[0] for lane in connectors] + [-1])
    conflicts &= source[:, None] != source[None, :]
    conflicts[count, :] = conflicts[:, count] = False
    return compact, conflicts, priority, clear_of
