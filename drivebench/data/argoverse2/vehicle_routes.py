"""Vehicle routes: which lanes a vehicle drives, as one dense path with speed limits along it.

Why: the simulation steps every vehicle along a 1-D path, so the map topology (successors, the
turns each lane allows, lane changes on dashed segments) is resolved here once per vehicle.
The turn a car takes is restricted by its lane (leftmost lane: left or straight, ...), so lane
choice carries information a model can use; a lane change blends two parallel centerlines.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from drivebench.data.argoverse2.synthetic_map import LEFT, RIGHT, STRAIGHT, RoadNetwork

PRE_EXTENSION = 150.0  # metres of straight road before a route's first lane (vehicles arriving)
POST_EXTENSION = 250.0  # metres after its last lane (vehicles leaving the map)


@dataclass
class VehiclePath:
    """A vehicle's route as a dense line at 1 m spacing with the lane under every point."""

    xy: np.ndarray  # (K, 2)
    lane: np.ndarray  # (K,) lane index; pre/post extensions use virtual ids
    lane_start: dict[int, float]  # lane id -> path coordinate where its segment starts
    map_start: float
    map_end: float
    maneuvers: np.ndarray  # (K,) bool: point on a turning connector
    next_lane: np.ndarray  # (K,) the lane after the current one (3 * n_lanes: none)
    next_start: np.ndarray  # (K,) path coordinate where that next lane starts


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


def build_path(net: RoadNetwork, steps: list[RouteStep]) -> VehiclePath:
    """Join the route's centerlines (blending across a lane change) and extend both ends.

    Dense centerlines are about 1 m apart, so a point index serves as the path coordinate.
    """
    n_lanes = len(net.lanes)
    first, last = steps[0][0], steps[-1][1]
    start_heading, end_heading = net.lanes[first].heading[0], net.lanes[last].heading[-1]
    pre = net.lanes[first].center[0] - np.array([np.cos(start_heading), np.sin(start_heading)]) * _PRE_RAMP
    post = net.lanes[last].center[-1] + np.array([np.cos(end_heading), np.sin(end_heading)]) * _POST_RAMP
    # Run-length bookkeeping: per piece its points; per run (lane, count, turning).
    pieces = [pre]
    run_lane, run_count, run_turn = [n_lanes + first], [len(pre)], [False]
    piece_size, piece_first_lane = [len(pre)], [n_lanes + first]
    lane_start: dict[int, float] = {n_lanes + first: 0.0}
    offset = len(pre)
    for i, (a, b, blend_from, blend_to) in enumerate(steps):
        center = net.lanes[a].center
        skip = 1 if i > 0 else 0  # consecutive centerlines share their joint point
        turning = net.lanes[a].maneuver in (LEFT, RIGHT)
        if a != b:
            weight = _blend_weights(len(center), blend_from, blend_to)
            center = (center + weight[:, None] * (net.lanes[b].center - center))[skip:]
            on_a = int(np.searchsorted(weight[skip:], 0.5))  # points still nearer lane a
            run_lane += [a, b]
            run_count += [on_a, len(center) - on_a]
            run_turn += [turning, turning]
        else:
            center = center[skip:]
            run_lane.append(a)
            run_count.append(len(center))
            run_turn.append(turning)
        lane_start.setdefault(a, float(offset))
        lane_start.setdefault(b, float(offset))
        pieces.append(center)
        piece_size.append(len(center))
        piece_first_lane.append(run_lane[-2] if a != b and run_count[-2] > 0 else run_lane[-1])
        offset += len(center)
    map_end = float(offset - 1)
    pieces.append(post)
    run_lane.append(2 * n_lanes + last)
    run_count.append(len(post))
    run_turn.append(False)
    piece_size.append(len(post))
    piece_first_lane.append(2 * n_lanes + last)
    lane_start[2 * n_lanes + last] = map_end
    # For merges: each piece knows the lane it leads into and where that starts.
    piece_starts = np.cumsum([0] + piece_size[:-1])
    next_lane = piece_first_lane[1:] + [3 * n_lanes]
    next_start = np.append(piece_starts[1:].astype(np.float64), np.inf)
    return VehiclePath(xy=np.concatenate(pieces), lane=np.repeat(run_lane, run_count), lane_start=lane_start,
                 map_start=float(len(pre)), map_end=map_end, maneuvers=np.repeat(run_turn, run_count),
                 next_lane=np.repeat(next_lane, piece_size), next_start=np.repeat(next_start, piece_size))


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
