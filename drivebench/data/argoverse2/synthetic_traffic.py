"""Agents of one synthetic scenario: who is where over 11 s, and what a tracker would have seen.

Why this shape: a forecasting model can only learn what the history and the map determine. So
vehicles drive along lane centerlines on routes through lane successors; their speed follows a
profile set by the curvature ahead (they slow before a turn, visibly in the history when the
turn is near) and by an IDM car-following rule (a braking leader is visible too); lane changes
towards a turn lane happen on dashed segments before the intersection. The turn a car takes is
restricted by its lane (leftmost lane: left or straight, ...), so lane choice carries the
information. Pedestrians walk across crosswalks and along sidewalks, cyclists ride bike lanes,
parked cars and static objects stand still.

Kinematics are consistent by construction: positions come from the simulation, velocity is their
central difference at 10 Hz, and heading is the direction of motion (the path tangent when
nearly stopped). Visibility is a range around the AV; the longest visible run of each agent
becomes its track, which yields fragments that appear and disappear, like real tracker output.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from drivebench.data.argoverse2 import schema
from drivebench.data.argoverse2.synthetic_map import LEFT, RIGHT, STRAIGHT, RoadNetwork

DT = schema.STEP_SECONDS
T = schema.NUM_STEPS
WARMUP_STEPS = 30
PRE_EXTENSION = 150.0  # metres of straight road before a route's first lane (vehicles arriving)
POST_EXTENSION = 250.0  # metres after its last lane (vehicles leaving the map)
MIN_TRACK_STEPS = 10
REACTION_STEPS = 3  # drivers re-assess who they follow every 0.3 s
MAX_BRAKE = 4.5  # m/s^2; firmer braking is rare in real traffic
NOT_ON_PATH = -1e9  # lane start of a lane that is not on a vehicle's path
CYCLIST_KERB_OFFSET = 1.0  # metres right of a car lane's centre
GAP_ACCEPTANCE = 3.0  # seconds: a yielding driver enters when the next priority car is further off


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


@dataclass
class _Agent:
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
class _Path:
    """A vehicle's route as a dense line at 1 m spacing with the lane under every point."""

    xy: np.ndarray  # (K, 2)
    lane: np.ndarray  # (K,) lane index; pre/post extensions use virtual ids
    lane_start: dict[int, float]  # lane id -> path coordinate where its segment starts
    map_start: float
    map_end: float
    maneuvers: np.ndarray  # (K,) bool: point on a turning connector
    next_lane: np.ndarray  # (K,) the lane after the current one (3 * n_lanes: none)
    next_start: np.ndarray  # (K,) path coordinate where that next lane starts


# --- routes ------------------------------------------------------------------------------
TURN_WEIGHTS = {STRAIGHT: 0.5, LEFT: 0.25, RIGHT: 0.25}


class RouteStep(NamedTuple):
    """One lane segment of a route; a lane change blends from ``lane`` to its neighbour ``target``
    over the blend fraction [blend_from, blend_to] (a change may span two segments)."""

    lane: int
    target: int
    blend_from: float = 0.0
    blend_to: float = 0.0


def plan_route(net: RoadNetwork, rng: np.random.Generator, start: int, max_length: float = 450.0) -> list[RouteStep]:
    """Lanes from ``start`` through successors, with a lane change where the chosen turn needs one."""
    steps: list[RouteStep] = []
    length = 0.0
    lane: int | None = start
    while lane is not None and length < max_length:
        current = net.lanes[lane]
        if current.is_intersection:
            steps.append(RouteStep(lane, lane))
            length += current.length
            lane = current.successors[0] if current.successors else None
            continue
        slots = net.roads[current.road].lanes[current.direction]
        chain = slots[current.slot][current.segment:]
        is_bike = current.lane_type == "BIKE"
        group = [current.slot] if is_bike else list(range(net.roads[current.road].n_lanes))
        options = [(c, slot) for slot in group for c in net.lanes[slots[slot][-1]].successors]
        changeable = [i for i, x in enumerate(chain[:-1]) if net.lanes[x].lane_change_ok]
        weights = np.array([
            TURN_WEIGHTS[net.lanes[c].maneuver or STRAIGHT]
            * (3.0 if slot == current.slot else 1.0 if (abs(slot - current.slot) == 1 and changeable) else 0.0)
            for c, slot in options
        ])
        if not options or weights.sum() == 0:
            steps += [RouteStep(x, x) for x in chain]
            break
        choice = int(np.searchsorted(np.cumsum(weights), rng.random() * weights.sum(), side="right"))
        connector, slot = options[choice]
        if slot == current.slot:
            steps += [RouteStep(x, x) for x in chain]
        else:
            # Change lanes over two segments where possible (4-6 s at city speeds), else one.
            k = changeable[int(rng.integers(len(changeable)))]
            target = slots[slot][current.segment:]
            if k + 1 in changeable:
                change = [RouteStep(chain[k], target[k], 0.0, 0.5), RouteStep(chain[k + 1], target[k + 1], 0.5, 1.0)]
            else:
                change = [RouteStep(chain[k], target[k], 0.0, 1.0)]
            steps += [RouteStep(x, x) for x in chain[:k]] + change + [RouteStep(y, y) for y in target[k + len(change):]]
        steps.append(RouteStep(connector, connector))
        length += sum(net.lanes[step.lane].length for step in steps[-len(chain) - 1:])
        lane = net.lanes[connector].successors[0] if net.lanes[connector].successors else None
    return steps


def _blend_weights(count: int, blend_from: float, blend_to: float) -> np.ndarray:
    key = (count, blend_from, blend_to)
    weight = _BLEND_CACHE.get(key)
    if weight is None:
        x = np.linspace(blend_from, blend_to, count)
        weight = _BLEND_CACHE[key] = x * x * (3 - 2 * x)  # smoothstep: no lateral speed at the ends
    return weight


def build_path(net: RoadNetwork, steps: list[RouteStep]) -> _Path:
    """Join the route's centerlines (blending across a lane change) and extend both ends.

    Dense centerlines are about 1 m apart, so a point index serves as the path coordinate.
    """
    n_lanes = len(net.lanes)
    first, last = steps[0][0], steps[-1][1]
    start_heading, end_heading = net.lanes[first].heading[0], net.lanes[last].heading[-1]
    pre = net.lanes[first].center[0] - np.array([np.cos(start_heading), np.sin(start_heading)]) * _PRE_RAMP
    pieces, piece_lanes, piece_turns = [pre], [np.full(len(pre), n_lanes + first)], [np.zeros(len(pre), bool)]
    lane_start: dict[int, float] = {n_lanes + first: 0.0}
    offset = len(pre)
    for i, (a, b, blend_from, blend_to) in enumerate(steps):
        center_a = net.lanes[a].center
        if a != b:
            weight = _blend_weights(len(center_a), blend_from, blend_to)
            center = center_a + weight[:, None] * (net.lanes[b].center - center_a)
            lanes = np.where(weight < 0.5, a, b)
        else:
            center, lanes = center_a, np.full(len(center_a), a)
        if i > 0:  # consecutive centerlines share their joint point
            center, lanes = center[1:], lanes[1:]
        lane_start.setdefault(a, float(offset))
        lane_start.setdefault(b, float(offset))
        pieces.append(center)
        piece_lanes.append(lanes)
        piece_turns.append(np.full(len(lanes), net.lanes[a].maneuver in (LEFT, RIGHT)))
        offset += len(center)
    map_end = float(offset - 1)
    post = net.lanes[last].center[-1] + np.array([np.cos(end_heading), np.sin(end_heading)]) * _POST_RAMP
    pieces.append(post)
    piece_lanes.append(np.full(len(post), 2 * n_lanes + last))
    piece_turns.append(np.zeros(len(post), bool))
    lane_start[2 * n_lanes + last] = map_end
    # For merges: each piece knows the lane it leads into and where that starts.
    sizes = [len(piece) for piece in piece_lanes]
    piece_starts = np.cumsum([0] + sizes[:-1])
    next_lane = [int(piece_lanes[k + 1][0]) for k in range(len(sizes) - 1)] + [3 * n_lanes]
    next_start = [float(piece_starts[k + 1]) for k in range(len(sizes) - 1)] + [np.inf]
    return _Path(xy=np.concatenate(pieces), lane=np.concatenate(piece_lanes), lane_start=lane_start,
                 map_start=float(len(pre)), map_end=map_end, maneuvers=np.concatenate(piece_turns),
                 next_lane=np.repeat(next_lane, sizes), next_start=np.repeat(next_start, sizes))


_PRE_RAMP = np.arange(PRE_EXTENSION, 0.0, -1.0)[:, None]
_POST_RAMP = np.arange(1.0, POST_EXTENSION + 1.0, 1.0)[:, None]
_BLEND_CACHE: dict[tuple[int, float, float], np.ndarray] = {}


def desired_speeds(paths: list[np.ndarray], cruise: np.ndarray, lateral_accel: np.ndarray,
                   comfort_brake: float) -> np.ndarray:
    """Speed limit along each 1 m path, concatenated: cruise speed, capped in curves (lateral
    acceleration), reached by braking at ``comfort_brake`` before it. Vectorised over paths."""
    sizes = np.array([len(p) for p in paths])
    owner = np.repeat(np.arange(len(paths)), sizes)
    starts = np.cumsum(sizes) - sizes
    xy = np.concatenate(paths)
    delta = np.diff(xy, axis=0)
    heading = np.arctan2(delta[:, 1], delta[:, 0])
    turn = np.abs((np.diff(heading) + np.pi) % (2 * np.pi) - np.pi)
    curvature = np.concatenate([[0.0], turn, [0.0]])
    curvature[starts] = 0.0  # across the join of two paths
    curvature[np.clip(starts - 1, 0, None)] = 0.0
    curvature = np.convolve(curvature, np.ones(7) / 7, mode="same")
    limit = np.minimum(cruise[owner], np.sqrt(lateral_accel[owner] / np.maximum(curvature, 1e-4)))
    local = np.arange(len(xy)) - starts[owner]
    # v(s)^2 <= min over s' >= s of v(s')^2 + 2 b (s' - s): a reverse running minimum per path;
    # later paths get a large offset so that they never win the minimum of an earlier one.
    big = 10.0 * (cruise.max() ** 2 + 2 * comfort_brake * sizes.max())
    value = limit**2 + 2 * comfort_brake * local + big * owner
    reach = np.minimum.accumulate(value[::-1])[::-1] - big * owner
    return np.sqrt(np.maximum(reach - 2 * comfort_brake * local, 0.0))


# --- vehicle simulation -------------------------------------------------------------------
@dataclass
class _Vehicle:
    object_type: str
    path: _Path
    s0: float
    cruise: float
    length: float
    max_accel: float
    headway: float
    lateral_accel: float


def _vehicle_params(rng: np.random.Generator, object_type: str) -> dict[str, float]:
    if object_type == "cyclist":
        return {"cruise": rng.uniform(3.5, 6.5), "length": 1.8, "max_accel": rng.uniform(0.6, 1.0),
                "headway": rng.uniform(1.0, 1.6), "lateral_accel": rng.uniform(1.5, 2.2)}
    if object_type == "bus":
        return {"cruise": rng.uniform(8.0, 11.0), "length": 12.0, "max_accel": rng.uniform(0.7, 1.1),
                "headway": rng.uniform(1.6, 2.2), "lateral_accel": rng.uniform(1.2, 1.8)}
    return {"cruise": rng.uniform(9.0, 15.0), "length": rng.uniform(4.2, 5.2), "max_accel": rng.uniform(1.2, 2.2),
            "headway": rng.uniform(1.0, 1.8), "lateral_accel": rng.uniform(1.8, 2.8)}


def simulate_vehicles(net: RoadNetwork, vehicles: list[_Vehicle], rng: np.random.Generator) -> list[_Agent]:
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
    occupied = np.zeros(no_connector + 1, dtype=bool)
    arriving = np.zeros(no_connector + 1, dtype=bool)
    for step in range(WARMUP_STEPS + T):
        index = offsets + np.clip(s.astype(int), 0, sizes - 1)
        look = offsets + np.clip((s + v_now).astype(int), 0, sizes - 1)  # one second ahead
        a_free = np.clip(0.8 * (np.minimum(speed_all[look], speed_all[index]) - v_now), -4.0, max_accel)
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
        leader_gap = np.maximum(lane_start[rows, lane_now[leader]] + along[leader],
                                lane_start[rows, next_lane[leader]] - to_next[leader]) - s - half_lengths[rows, leader]
        follows = (leader_gap > -1.0) & (leader_gap < 150.0) & (leader != rows)
        desired_gap = np.maximum(2.5 + v_now * headway + v_now * (v_now - v_now[leader]) / brake_term, 0.0)
        a_follow = max_accel * (1 - (desired_gap / np.clip(leader_gap, 0.5, None)) ** 2)
        command = np.where(follows, np.minimum(a_free, a_follow), a_free)
        stop_gap = np.maximum(to_next - 1.5, 0.3)
        a_stop = max_accel * (1 - ((1.0 + v_now * headway + v_now * v_now / brake_term) / stop_gap) ** 2)
        command = np.clip(np.where(blocked, np.minimum(command, a_stop), command), -MAX_BRAKE, max_accel)
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
        _Agent(object_type=vehicle.object_type, position=position[:, i], heading=heading[:, i],
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


def _spawn_vehicles(net: RoadNetwork, rng: np.random.Generator, size: TrafficSize) -> list[_Vehicle]:
    vehicles: list[_Vehicle] = []

    def add(start_lane: int, object_type: str, along: float) -> None:
        path = build_path(net, plan_route(net, rng, start_lane))
        vehicles.append(_Vehicle(object_type=object_type, path=path, s0=path.map_start + along,
                                 **_vehicle_params(rng, object_type)))

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
def _walker(rng: np.random.Generator, path: np.ndarray, object_type: str = "pedestrian") -> _Agent:
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
    return _Agent(object_type=object_type, position=position, heading=heading, velocity=velocity,
                  in_map=np.ones(T, bool), moving=bool(s[-1] - s[0] > 2.0))


def _standing(position: np.ndarray, heading: float, object_type: str) -> _Agent:
    return _Agent(object_type=object_type, position=np.repeat(position[None], T, axis=0),
                  heading=np.full(T, heading), velocity=np.zeros((T, 2)), in_map=np.ones(T, bool), moving=False)


def _other_agents(net: RoadNetwork, rng: np.random.Generator, size: TrafficSize) -> list[_Agent]:
    agents: list[_Agent] = []
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


def _pick_av(agents: list[_Agent], net: RoadNetwork, rng: np.random.Generator) -> int | None:
    candidates = []
    for i, agent in enumerate(agents):
        if agent.is_vehicle_sim and agent.object_type == "vehicle" and agent.moving and agent.in_map.all():
            near_node = np.min(np.linalg.norm(net.nodes - agent.position[schema.NUM_HISTORICAL_STEPS - 1], axis=1))
            candidates.append((i, near_node < 70.0))
    if not candidates:
        return None
    preferred = [i for i, near in candidates if near] or [i for i, _ in candidates]
    return int(rng.choice(preferred))


def observe(agents: list[_Agent], av: int, net: RoadNetwork, rng: np.random.Generator,
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
