"""Road network of one synthetic scenario, in a local metric frame (x east, y north, metres).

Why this shape: QCNet learns from lane topology (successors, neighbours), lane geometry and mark
types. So the generator builds what real Argoverse 2 maps show near an intersection: roads of
one to three lanes per direction (plus bike lanes), with curves, split into lane segments of
20-30 m; signalised-looking intersections whose connector lanes join each inbound lane to the
exits its position allows (leftmost lane: left turns, rightmost: right turns); crosswalks across
every approach; drivable areas. Vehicles in ``synthetic_traffic`` then drive along these lanes.

Each lane keeps a dense centerline (about one point per metre) for simulation; ``format_writer``
resamples it to the sparse polylines of the JSON map.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from drivebench.polylines import resample

DENSE_STEP = 1.0  # metres between dense centerline points
STRAIGHT, LEFT, RIGHT = "straight", "left", "right"


@dataclass(frozen=True)
class NetworkSize:
    """Knobs that set how big a road network is."""

    intersections: int  # 1 or 2 (two are joined by a link road)
    lanes_per_direction: tuple[int, ...]
    lane_weights: tuple[float, ...]
    arm_length: tuple[float, float]  # roads from an intersection to the map edge
    link_length: tuple[float, float]  # road between two intersections
    segment_length: tuple[float, float]
    bike_lane_prob: float
    tee_prob: float  # chance that an intersection has three arms instead of four
    max_curvature: float  # 1/m, reached 20 m after a straight start


@dataclass
class Lane:
    """One lane segment. ``center`` is dense and ordered in the travel direction."""

    index: int
    lane_type: str  # VEHICLE | BIKE | BUS
    is_intersection: bool
    center: np.ndarray  # (K, 2)
    half_width: float
    left_mark: str = "NONE"
    right_mark: str = "NONE"
    left_neighbor: int | None = None
    right_neighbor: int | None = None
    predecessors: list[int] = field(default_factory=list)
    successors: list[int] = field(default_factory=list)
    maneuver: str | None = None  # connectors only: straight | left | right
    priority: int = 0  # connectors only: 2 main road straight/right, 1 main road left, 0 side road
    road: int = -1  # -1 for intersection connectors
    direction: int = 0  # +1 along the road's reference, -1 against it
    slot: int = 0  # 0 = next to the road centre; bike lanes come after the vehicle lanes
    segment: int = 0  # position along the road in travel order
    lane_change_ok: bool = False  # dashed white towards a same-direction neighbour
    heading: np.ndarray = field(init=False)  # (K,) travel direction at each centerline point
    length: float = field(init=False)

    def __post_init__(self) -> None:
        delta = self.center[1:] - self.center[:-1]
        heading = np.arctan2(delta[:, 1], delta[:, 0])
        self.heading = np.concatenate((heading, heading[-1:]))
        self.length = float(np.sqrt((delta * delta).sum(axis=1)).sum())


@dataclass
class Road:
    """A two-way road: a reference line with lanes offset to either side."""

    ref: np.ndarray  # (N, 2) dense reference (the road centre line)
    heading: np.ndarray  # (N,)
    n_lanes: int
    lane_width: float
    bike_width: float  # 0: no bike lane
    start_node: int | None
    end_node: int | None
    lanes: dict[int, list[list[int]]] = field(default_factory=dict)  # direction -> slot -> segments

    @property
    def half_width(self) -> float:
        return self.n_lanes * self.lane_width + self.bike_width

    @property
    def length(self) -> float:
        return float(np.hypot(*np.diff(self.ref, axis=0).T).sum())


@dataclass
class Approach:
    """Where one road meets one intersection."""

    node: int
    road: int
    inbound: list[int]  # last segments of the lanes arriving, slot order (0 = leftmost)
    outbound: list[int]  # first segments of the lanes leaving, slot order
    inbound_bike: int | None
    outbound_bike: int | None
    in_heading: float  # travel heading at the end of the inbound lanes
    out_heading: float  # travel heading at the start of the outbound lanes
    end_point: np.ndarray  # reference point where the road meets the intersection
    outward: np.ndarray  # unit vector from the intersection along the road


@dataclass
class Crosswalk:
    edge1: np.ndarray  # (2, 2)
    edge2: np.ndarray  # (2, 2)
    walk_path: np.ndarray  # dense pedestrian path: sidewalk, across, sidewalk


@dataclass
class RoadNetwork:
    lanes: list[Lane]
    roads: list[Road]
    nodes: np.ndarray  # (I, 2) intersection centres
    approaches: list[Approach]
    crosswalks: list[Crosswalk]
    drivable_areas: list[np.ndarray]
    sidewalks: list[np.ndarray]  # dense pedestrian paths along roads
    curb_spots: list[tuple[np.ndarray, float]]  # (position, heading) just outside the outer lanes
    roadside_spots: list[np.ndarray]  # off the road, for static objects
    entry_lanes: list[int]  # vehicle lanes entering from the map edge (first segments)
    bike_entry_lanes: list[int]
    departure_lanes: list[int]  # first segments of vehicle lanes leaving an intersection


def wrap_angle(angle: np.ndarray | float) -> np.ndarray | float:
    return (angle + np.pi) % (2 * np.pi) - np.pi


def left_normals(heading: np.ndarray) -> np.ndarray:
    return np.stack([-np.sin(heading), np.cos(heading)], axis=-1)


def point_headings(points: np.ndarray) -> np.ndarray:
    """Direction of the segment leaving each point (the last point repeats the one before)."""
    delta = np.diff(points, axis=0)
    heading = np.arctan2(delta[:, 1], delta[:, 0])
    return np.append(heading, heading[-1])


def _curved_reference(start: np.ndarray, heading: float, length: float, straight: float,
                      curvature: float) -> tuple[np.ndarray, np.ndarray]:
    """Dense line that runs straight, then eases into a constant curvature over 20 m."""
    n = max(2, int(math.ceil(length / DENSE_STEP)) + 1)
    u = np.linspace(0.0, length, n)
    kappa = curvature * np.clip((u - straight) / 20.0, 0.0, 1.0)
    du = u[1] - u[0]
    theta = heading + np.concatenate([[0.0], np.cumsum(0.5 * (kappa[1:] + kappa[:-1]) * du)])
    mid = 0.5 * (theta[1:] + theta[:-1])
    steps = np.stack([np.cos(mid), np.sin(mid)], axis=-1) * du
    points = start + np.concatenate([np.zeros((1, 2)), np.cumsum(steps, axis=0)])
    return points, theta


def _bezier_lane(p0: np.ndarray, h0: float, p3: np.ndarray, h3: float) -> np.ndarray:
    """Dense cubic Bezier from pose (p0, h0) to (p3, h3), close to a circular arc for turns."""
    chord = float(np.linalg.norm(p3 - p0))
    turn = abs(float(wrap_angle(h3 - h0)))
    ratio = 1.0 / 3.0 if turn < 1e-3 else (2.0 / 3.0) * math.tan(turn / 4) / math.sin(turn / 2)
    handle = ratio * chord
    p1 = p0 + handle * np.array([math.cos(h0), math.sin(h0)])
    p2 = p3 - handle * np.array([math.cos(h3), math.sin(h3)])
    curve = _BEZIER_BASIS @ np.stack([p0, p1, p2, p3])
    delta = curve[1:] - curve[:-1]
    length = float(np.sqrt((delta * delta).sum(axis=1)).sum())
    return resample(curve, max(2, int(round(length / DENSE_STEP)) + 1))


_T = np.linspace(0.0, 1.0, 32)[:, None]
_BEZIER_BASIS = np.hstack([(1 - _T) ** 3, 3 * (1 - _T) ** 2 * _T, 3 * (1 - _T) * _T**2, _T**3])  # (32, 4)


def _straight(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Dense straight line from a to b (both included)."""
    count = max(2, int(np.hypot(*(b - a)) / DENSE_STEP) + 1)
    return a + (b - a) * (np.arange(count) / (count - 1))[:, None]


class _NetworkBuilder:
    """Builds a RoadNetwork step by step: layout, roads, lanes, connectors, crosswalks, extras."""

    def __init__(self, rng: np.random.Generator, size: NetworkSize) -> None:
        self.rng = rng
        self.size = size
        self.lanes: list[Lane] = []
        self.roads: list[Road] = []
        self.approaches: list[Approach] = []

    # --- layout -------------------------------------------------------------------------
    def _road_profile(self) -> tuple[int, float, float]:
        rng, size = self.rng, self.size
        n_lanes = int(rng.choice(size.lanes_per_direction, p=np.asarray(size.lane_weights) / sum(size.lane_weights)))
        lane_width = float(rng.uniform(3.3, 3.8))
        bike_width = float(rng.uniform(1.5, 2.0)) if rng.random() < size.bike_lane_prob else 0.0
        return n_lanes, lane_width, bike_width

    def build(self) -> RoadNetwork:
        rng, size = self.rng, self.size
        n_nodes = size.intersections
        # Arm directions per node; node 1 sits east of node 0, joined by a link road.
        node_arms: list[list[float]] = []
        for node in range(n_nodes):
            base = [0.0, 0.5 * np.pi, np.pi, 1.5 * np.pi]
            jitter = rng.uniform(-0.2, 0.2, size=4)
            arms = [b + j for b, j in zip(base, jitter)]
            link_arm = 0 if node == 0 else 2
            if n_nodes > 1:
                arms[link_arm] = base[link_arm]
            if rng.random() < size.tee_prob:
                droppable = [i for i in range(4) if n_nodes == 1 or i != link_arm]
                arms.pop(int(rng.choice(droppable)))
            node_arms.append(arms)
        profiles = [[self._road_profile() for _ in arms] for arms in node_arms]
        if n_nodes > 1:  # one shared profile for the link road, seen from both nodes
            profiles[1][[abs(wrap_angle(a - np.pi)) < 1e-6 for a in node_arms[1]].index(True)] = profiles[0][0]
        crosswalk_width = float(rng.uniform(3.0, 4.0))
        radius = [max(p[0] * p[1] + p[2] for p in node_profiles) + crosswalk_width + 4.0
                  for node_profiles in profiles]
        nodes = [np.zeros(2)]
        if n_nodes > 1:
            link = float(rng.uniform(*size.link_length))
            nodes.append(np.array([radius[0] + link + radius[1], 0.0]))
        self.nodes = np.stack(nodes)
        self.crosswalk_width = crosswalk_width

        for node, arms in enumerate(node_arms):
            for arm, angle in enumerate(arms):
                is_link = n_nodes > 1 and ((node == 0 and arm == 0) or (node == 1 and abs(wrap_angle(angle - np.pi)) < 1e-6))
                if is_link:
                    if node == 1:
                        continue  # built from node 0
                    start = self.nodes[0] + radius[0] * np.array([1.0, 0.0])
                    end = self.nodes[1] - radius[1] * np.array([1.0, 0.0])
                    length = float(np.linalg.norm(end - start))
                    ref, heading = _curved_reference(start, 0.0, length, length, 0.0)
                    self._add_road(ref, heading, profiles[node][arm], start_node=0, end_node=1)
                    continue
                start = self.nodes[node] + radius[node] * np.array([math.cos(angle), math.sin(angle)])
                length = float(rng.uniform(*size.arm_length))
                curvature = float(rng.uniform(-size.max_curvature, size.max_curvature)) if rng.random() < 0.6 else 0.0
                ref, heading = _curved_reference(start, angle, length, float(rng.uniform(8.0, 30.0)), curvature)
                self._add_road(ref, heading, profiles[node][arm], start_node=node, end_node=None)

        for node in range(n_nodes):
            self._add_connectors(node)
        return self._finish()

    # --- roads and their lanes ----------------------------------------------------------
    def _add_road(self, ref: np.ndarray, heading: np.ndarray, profile: tuple[int, float, float],
                  start_node: int | None, end_node: int | None) -> None:
        rng = self.rng
        n_lanes, lane_width, bike_width = profile
        road = Road(ref, heading, n_lanes, lane_width, bike_width, start_node, end_node)
        road_index = len(self.roads)
        self.roads.append(road)
        n_points = len(ref)
        n_segments = max(1, int(round(road.length / rng.uniform(*self.size.segment_length))))
        breaks = np.linspace(0, n_points - 1, n_segments + 1).round().astype(int)
        normals = left_normals(heading)
        yellow = str(rng.choice(["DOUBLE_SOLID_YELLOW", "SOLID_YELLOW", "DASHED_YELLOW"],
                                p=[0.5, 0.2, 0.3] if n_lanes == 1 else [0.75, 0.25, 0.0]))
        curb = "SOLID_WHITE" if bike_width > 0 else str(rng.choice(["SOLID_WHITE", "NONE"], p=[0.6, 0.4]))
        for direction in (+1, -1):
            arrives_at_node = (end_node if direction > 0 else start_node) is not None
            slots: list[list[int]] = []
            n_slots = n_lanes + (1 if bike_width > 0 else 0)
            for slot in range(n_slots):
                is_bike = slot == n_lanes
                offset = (n_lanes * lane_width + bike_width / 2) if is_bike else (slot + 0.5) * lane_width
                half_width = bike_width / 2 if is_bike else lane_width / 2
                center_full = ref - direction * offset * normals
                segments: list[int] = []
                order = range(n_segments) if direction > 0 else range(n_segments - 1, -1, -1)
                for travel_index, seg in enumerate(order):
                    center = center_full[breaks[seg]: breaks[seg + 1] + 1]
                    if direction < 0:
                        center = center[::-1]
                    last_before_node = arrives_at_node and travel_index == n_segments - 1 and n_segments > 1
                    lane = Lane(
                        index=len(self.lanes), lane_type="BIKE" if is_bike else "VEHICLE", is_intersection=False,
                        center=center, half_width=half_width, road=road_index, direction=direction, slot=slot,
                        segment=travel_index, lane_change_ok=not is_bike and not last_before_node,
                    )
                    lane.left_mark, lane.right_mark = self._marks(slot, n_lanes, is_bike, yellow, curb,
                                                                  lane.lane_change_ok)
                    self.lanes.append(lane)
                    segments.append(lane.index)
                slots.append(segments)
            # Successors along the road, neighbours across it.
            for segments in slots:
                for a, b in zip(segments[:-1], segments[1:]):
                    self.lanes[a].successors.append(b)
                    self.lanes[b].predecessors.append(a)
            for slot in range(1, n_slots):
                for inner, outer in zip(slots[slot - 1], slots[slot]):
                    self.lanes[inner].right_neighbor = outer
                    self.lanes[outer].left_neighbor = inner
            road.lanes[direction] = slots

        for node, at_start in ((start_node, True), (end_node, False)):
            if node is not None:
                self._add_approach(road_index, node, at_start)

    @staticmethod
    def _marks(slot: int, n_lanes: int, is_bike: bool, yellow: str, curb: str, change_ok: bool) -> tuple[str, str]:
        if is_bike:
            return "SOLID_WHITE", "NONE"
        divider = "DASHED_WHITE" if change_ok else "SOLID_WHITE"
        left = yellow if slot == 0 else divider
        right = curb if slot == n_lanes - 1 else divider
        return left, right

    def _add_approach(self, road_index: int, node: int, at_start: bool) -> None:
        road = self.roads[road_index]
        arriving = -1 if at_start else +1  # lanes travelling towards this end
        n = road.n_lanes
        inbound = [segments[-1] for segments in road.lanes[arriving][:n]]
        outbound = [segments[0] for segments in road.lanes[-arriving][:n]]
        has_bike = road.bike_width > 0
        end_point = road.ref[0] if at_start else road.ref[-1]
        along = road.heading[0] if at_start else road.heading[-1] + np.pi
        self.approaches.append(Approach(
            node=node, road=road_index, inbound=inbound, outbound=outbound,
            inbound_bike=road.lanes[arriving][n][-1] if has_bike else None,
            outbound_bike=road.lanes[-arriving][n][0] if has_bike else None,
            in_heading=float(self.lanes[inbound[0]].heading[-1]),
            out_heading=float(self.lanes[outbound[0]].heading[0]),
            end_point=end_point, outward=np.array([math.cos(along), math.sin(along)]),
        ))

    # --- intersections ------------------------------------------------------------------
    @staticmethod
    def _allowed(slot: int, n_in: int) -> set[str]:
        """Which maneuvers a lane may take, from its position (leftmost turns left, ...)."""
        if n_in == 1:
            return {LEFT, STRAIGHT, RIGHT}
        if n_in == 2:
            return {LEFT, STRAIGHT} if slot == 0 else {STRAIGHT, RIGHT}
        if slot == 0:
            return {LEFT}
        return {STRAIGHT, RIGHT} if slot == n_in - 1 else {STRAIGHT}

    def _connect(self, source: int, target: int, maneuver: str, lane_type: str, main_road: bool) -> None:
        src, dst = self.lanes[source], self.lanes[target]
        h0 = float(src.heading[-1])
        h3 = float(dst.heading[0])
        lane = Lane(index=len(self.lanes), lane_type=lane_type, is_intersection=True,
                    center=_bezier_lane(src.center[-1], h0, dst.center[0], h3),
                    half_width=min(src.half_width, dst.half_width), maneuver=maneuver,
                    priority=(1 if maneuver == LEFT else 2) if main_road else 0,
                    predecessors=[source], successors=[target])
        self.lanes.append(lane)
        src.successors.append(lane.index)
        dst.predecessors.append(lane.index)

    @staticmethod
    def _exits(a: Approach, approaches: list[Approach]) -> dict[str, Approach]:
        """The approach each maneuver from ``a`` leaves by, from the change of heading."""
        exits: dict[str, Approach] = {}
        for b in approaches:
            if b is a:
                continue
            delta = float(wrap_angle(b.out_heading - a.in_heading))
            if abs(delta) < np.radians(40):
                exits[STRAIGHT] = b
            elif np.radians(40) <= delta < np.radians(150):
                exits[LEFT] = b
            elif -np.radians(150) < delta <= -np.radians(40):
                exits[RIGHT] = b
        return exits

    def _add_connectors(self, node: int) -> None:
        approaches = [a for a in self.approaches if a.node == node]
        # The main road: the straight-through pair of approaches with the most lanes. Its
        # vehicles have the right of way; side-road vehicles and main-road left turns yield.
        straight_pairs = [(a, b) for a in approaches for b in [self._exits(a, approaches).get(STRAIGHT)] if b]
        main: set[int] = set()
        if straight_pairs:
            widest = max(straight_pairs, key=lambda ab: self.roads[ab[0].road].n_lanes + self.roads[ab[1].road].n_lanes)
            main = {id(widest[0]), id(widest[1])}
        for a in approaches:
            exits = self._exits(a, approaches)
            if not exits:
                continue
            on_main = id(a) in main
            n_in = len(a.inbound)
            made: set[tuple[int, int]] = set()
            for slot, source in enumerate(a.inbound):
                maneuvers = self._allowed(slot, n_in) & exits.keys() or set(exits)
                for maneuver in sorted(maneuvers):
                    b = exits[maneuver]
                    n_out = len(b.outbound)
                    target_slot = {LEFT: 0, RIGHT: n_out - 1}.get(maneuver, min(slot, n_out - 1))
                    if (source, b.outbound[target_slot]) not in made:
                        made.add((source, b.outbound[target_slot]))
                        self._connect(source, b.outbound[target_slot], maneuver, "VEHICLE", on_main)
            if a.inbound_bike is not None:
                for maneuver in (STRAIGHT, RIGHT):
                    if maneuver in exits:
                        b = exits[maneuver]
                        target = b.outbound_bike if b.outbound_bike is not None else b.outbound[-1]
                        self._connect(a.inbound_bike, target, maneuver, "BIKE", on_main)

    # --- crosswalks, areas, places for parked and static objects --------------------------
    def _finish(self) -> RoadNetwork:
        rng = self.rng
        crosswalks: list[Crosswalk] = []
        drivable_areas: list[np.ndarray] = []
        sidewalks: list[np.ndarray] = []
        curb_spots: list[tuple[np.ndarray, float]] = []
        roadside_spots: list[np.ndarray] = []
        width = self.crosswalk_width
        for a in self.approaches:
            road = self.roads[a.road]
            across = np.array([-a.outward[1], a.outward[0]])
            reach = road.half_width + 0.5
            near = a.end_point - a.outward * 1.0
            far = a.end_point - a.outward * (1.0 + width)
            sign = 1.0 if rng.random() < 0.5 else -1.0
            edge_near = np.stack([near - sign * reach * across, near + sign * reach * across])
            edge_far = np.stack([far - sign * reach * across, far + sign * reach * across])
            edge1, edge2 = (edge_near, edge_far) if rng.random() < 0.5 else (edge_far, edge_near)
            middle = a.end_point - a.outward * (1.0 + width / 2)
            side = road.half_width + 2.5
            waypoints = np.stack([
                a.end_point + a.outward * 25.0 + side * across,
                middle + side * across,
                middle - side * across,
                a.end_point + a.outward * 25.0 - side * across,
            ])
            if rng.random() < 0.5:
                waypoints = waypoints[::-1]
            walk = np.concatenate([_straight(waypoints[i], waypoints[i + 1])[:-1] for i in range(3)] + [waypoints[-1:]])
            crosswalks.append(Crosswalk(edge1=edge1, edge2=edge2, walk_path=walk))

        for road in self.roads:
            normals = left_normals(road.heading)
            hw = road.half_width
            step = max(1, len(road.ref) // 8)
            left_edge = (road.ref + hw * normals)[::step]
            right_edge = (road.ref - hw * normals)[::step]
            drivable_areas.append(np.concatenate([right_edge, left_edge[::-1]]))
            for side in (+1.0, -1.0):
                sidewalks.append(road.ref + side * (hw + 2.5) * normals)
            # Parking along the curb, on the travel side of each direction.
            usable = np.arange(5, len(road.ref) - 5, 7)
            for side, turn in ((+1.0, np.pi), (-1.0, 0.0)):
                positions = road.ref[usable] + side * (hw + 1.2) * normals[usable]
                curb_spots += list(zip(positions, (road.heading[usable] + turn).tolist()))
            for i in rng.choice(len(road.ref), size=min(6, len(road.ref)), replace=False):
                side = 1.0 if rng.random() < 0.5 else -1.0
                roadside_spots.append(road.ref[i] + side * (hw + rng.uniform(2.0, 6.0)) * normals[i])

        for node, centre in enumerate(self.nodes):
            corners = []
            for a in self.approaches:
                if a.node == node:
                    across = np.array([-a.outward[1], a.outward[0]])
                    hw = self.roads[a.road].half_width
                    corners += [a.end_point + hw * across, a.end_point - hw * across]
            corners_arr = np.stack(corners)
            angles = np.arctan2(corners_arr[:, 1] - centre[1], corners_arr[:, 0] - centre[0])
            drivable_areas.append(corners_arr[np.argsort(angles)])

        entry_lanes, bike_entry_lanes, departure_lanes = [], [], []
        for road in self.roads:
            for direction, slots in road.lanes.items():
                starts_at_edge = (road.start_node if direction > 0 else road.end_node) is None
                for slot, segments in enumerate(slots):
                    first = segments[0]
                    if slot == road.n_lanes:
                        if starts_at_edge:
                            bike_entry_lanes.append(first)
                    elif starts_at_edge:
                        entry_lanes.append(first)
                    else:
                        departure_lanes.append(first)
        return RoadNetwork(
            lanes=self.lanes, roads=self.roads, nodes=self.nodes, approaches=self.approaches,
            crosswalks=crosswalks, drivable_areas=drivable_areas, sidewalks=sidewalks,
            curb_spots=curb_spots, roadside_spots=roadside_spots, entry_lanes=entry_lanes,
            bike_entry_lanes=bike_entry_lanes, departure_lanes=departure_lanes,
        )


def build_network(rng: np.random.Generator, size: NetworkSize) -> RoadNetwork:
    """A random road network: one or two intersections with their arms, lanes and crosswalks."""
    return _NetworkBuilder(rng, size).build()
