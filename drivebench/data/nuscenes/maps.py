"""A grid city per map location, written as nuScenes map-expansion JSON (v1.3) and a map mask PNG.

Why a grid: every map element the models learn (lane and road dividers, ped crossings, road
boundaries) appears at every intersection, and the lane graph is strongly connected, so routes of
any length exist. The same ``CityMap`` feeds the JSON (read by ``NuScenesMap``), the camera
renderer, the LiDAR ray caster and the occupancy labels, so all of them agree.

Conventions: metres in the map frame (x east, y north, positive coordinates as in nuScenes);
right-hand traffic; two lanes of 3.5 m per direction.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import cv2
import numpy as np
from shapely.geometry import LineString, MultiPolygon, Point, Polygon, box
from shapely.ops import unary_union

LANE_WIDTH = 3.5
ROAD_HALF = 2 * LANE_WIDTH  # centreline to road edge
INTERSECTION_HALF = 12.0  # centre to the end of an intersection arm
FILLET_RADIUS = 5.0  # curb radius at intersection corners
SIDEWALK = 3.5
CROSSING_BAND = (8.0, 11.0)  # distance from the intersection centre
STOP_LINE_BAND = (11.4, 11.9)
LANE_OFFSETS = (0.5 * LANE_WIDTH, 1.5 * LANE_WIDTH)  # inner, outer lane centre from the centreline
MAP_MARGIN = 40.0
MAP_VERSION = "1.3"


def make_token(*parts: object) -> str:
    """Deterministic 32-hex token, the shape of a nuScenes token."""
    return hashlib.md5("/".join(map(str, parts)).encode()).hexdigest()


def _left(v: np.ndarray) -> np.ndarray:
    return np.array([-v[1], v[0]])


def _right(v: np.ndarray) -> np.ndarray:
    return np.array([v[1], -v[0]])


def _yaw(v: np.ndarray) -> float:
    return float(math.atan2(v[1], v[0]))


def _rect(origin: np.ndarray, along: np.ndarray, s0: float, s1: float, w0: float, w1: float) -> np.ndarray:
    """Rectangle spanned by ``along`` in [s0, s1] and its left normal in [w0, w1] (counter-clockwise)."""
    n = _left(along)
    pts = [origin + along * s + n * w for s, w in ((s0, w0), (s1, w0), (s1, w1), (s0, w1))]
    return np.array(pts)


@dataclass
class LanePath:
    """A lane or lane connector: its centreline in travel direction and its graph neighbours."""

    token: str
    xy: np.ndarray
    is_connector: bool
    outgoing: list[str] = field(default_factory=list)
    incoming: list[str] = field(default_factory=list)
    turn: str = "straight"  # for connectors: straight | left | right
    outer: bool = False  # lanes: the right neighbour is the road edge

    def __post_init__(self) -> None:
        seg = np.linalg.norm(np.diff(self.xy, axis=0), axis=1)
        self.cum = np.concatenate([[0.0], np.cumsum(seg)])

    @property
    def length(self) -> float:
        return float(self.cum[-1])


class MapBuilder:
    """Collects map-expansion records; geometry goes through node/line/polygon like the real files."""

    LAYERS = (
        "polygon", "line", "node", "drivable_area", "road_segment", "road_block", "lane", "ped_crossing",
        "walkway", "stop_line", "carpark_area", "road_divider", "lane_divider", "traffic_light",
        "lane_connector",
    )

    def __init__(self, location: str, seed: int) -> None:
        self.location = location
        self.seed = seed
        self.records: dict[str, list[dict]] = {name: [] for name in self.LAYERS}
        self.arcline_path_3: dict[str, list[dict]] = {}
        self.connectivity: dict[str, dict[str, list[str]]] = {}
        self._count = 0

    def token(self, kind: str) -> str:
        self._count += 1
        return make_token("map", self.location, self.seed, kind, self._count)

    def node(self, xy: np.ndarray) -> str:
        tok = self.token("node")
        self.records["node"].append({"token": tok, "x": round(float(xy[0]), 4), "y": round(float(xy[1]), 4)})
        return tok

    def line(self, coords: np.ndarray) -> tuple[str, list[str]]:
        nodes = [self.node(p) for p in coords]
        tok = self.token("line")
        self.records["line"].append({"token": tok, "node_tokens": nodes})
        return tok, nodes

    def polygon(self, geom: Polygon) -> str:
        geom = geom.buffer(0) if not geom.is_valid else geom
        ext = np.asarray(geom.exterior.coords)[:-1]
        holes = [{"node_tokens": [self.node(p) for p in np.asarray(h.coords)[:-1]]} for h in geom.interiors]
        tok = self.token("polygon")
        self.records["polygon"].append(
            {"token": tok, "exterior_node_tokens": [self.node(p) for p in ext], "holes": holes}
        )
        return tok

    def add(self, layer: str, record: dict) -> str:
        record.setdefault("token", self.token(layer))
        self.records[layer].append(record)
        return record["token"]

    def to_json(self, canvas_edge: tuple[float, float]) -> dict:
        out: dict = {"version": MAP_VERSION, "canvas_edge": [float(canvas_edge[0]), float(canvas_edge[1])]}
        out.update(self.records)
        out["arcline_path_3"] = self.arcline_path_3
        out["connectivity"] = self.connectivity
        return out


@dataclass
class CityMap:
    """Everything about one location's map that the generator draws, casts rays at, or writes."""

    location: str
    canvas: tuple[float, float]
    expansion: dict
    lanes: dict[str, LanePath]
    road_polygons: list[Polygon]  # road segments and intersections
    drivable: Polygon | MultiPolygon
    walkways: list[Polygon]
    block_interiors: list[Polygon]
    carparks: list[Polygon]
    crossing_stripes: np.ndarray  # (Q, 4, 2) zebra stripes
    white_markings: np.ndarray  # (Q, 4, 2) dashed lane dividers and stop lines
    yellow_markings: np.ndarray  # (Q, 4, 2) double centre line
    buildings: np.ndarray  # (B, 5): x0, y0, x1, y1, height (axis aligned)
    building_colors: np.ndarray  # (B, 3) BGR uint8
    trees: np.ndarray  # (T, 4): x, y, crown radius, crown top
    sidewalk_loops: list[np.ndarray]  # closed walking paths for pedestrians
    crossing_paths: list[np.ndarray]  # (2, 2) straight walks across ped crossings
    parking_spots: np.ndarray  # (P, 3): x, y, yaw inside car parks
    curb_sites: np.ndarray  # (C, 3): x, y, yaw on the sidewalk along the curb (cones, barriers)
    lane_tokens_by_segment: dict[str, list[str]] = field(default_factory=dict)

    @property
    def start_lanes(self) -> list[str]:
        return [t for t, lane in self.lanes.items() if not lane.is_connector]


def _intersection_polygon(centre: np.ndarray, arms: list[np.ndarray]) -> Polygon:
    """Core square, the arms that exist, and rounded corners between adjacent existing arms."""
    h, r = ROAD_HALF, INTERSECTION_HALF
    parts = [box(centre[0] - h, centre[1] - h, centre[0] + h, centre[1] + h)]
    for d in arms:
        parts.append(Polygon(_rect(centre, d, 0.0, r, -h, h)))
    for d in arms:
        e = _left(d)
        if any(np.allclose(e, a) for a in arms):
            corner = centre + d * r + e * r
            square = Polygon(_rect(centre, d, h, r, h, r))
            parts.append(square.difference(Point(corner).buffer(FILLET_RADIUS, 16)))
    return unary_union(parts)


def _quarter_arc(p0: np.ndarray, heading: np.ndarray, radius: float, left: bool, step: float = 1.0) -> np.ndarray:
    normal = _left(heading) if left else _right(heading)
    centre = p0 + normal * radius
    start = math.atan2(p0[1] - centre[1], p0[0] - centre[0])
    sweep = math.pi / 2 if left else -math.pi / 2
    n = max(4, int(math.ceil(abs(sweep) * radius / step)))
    ang = start + np.linspace(0.0, sweep, n + 1)
    return np.stack([centre[0] + radius * np.cos(ang), centre[1] + radius * np.sin(ang)], axis=1)


def _dashes(p0: np.ndarray, p1: np.ndarray, width: float, dash: float, gap: float) -> list[np.ndarray]:
    d = p1 - p0
    length = float(np.linalg.norm(d))
    u = d / length
    out = []
    s = gap / 2
    while s + dash <= length:
        out.append(_rect(p0, u, s, s + dash, -width / 2, width / 2))
        s += dash + gap
    return out


def build_city_map(location: str, seed: int, n_intersections: int, spacing: float) -> CityMap:
    """Lay out an ``n x n`` grid of intersections ``spacing`` metres apart and build every layer."""
    rng = np.random.default_rng([seed, sum(map(ord, location))])
    mb = MapBuilder(location, seed)
    origin = 60.0 + 13.0 * (sum(map(ord, location)) % 7)
    coords = origin + MAP_MARGIN + spacing * np.arange(n_intersections)
    n = n_intersections
    centres = {(i, j): np.array([coords[i], coords[j]]) for i in range(n) for j in range(n)}
    dirs = {"E": np.array([1.0, 0.0]), "W": np.array([-1.0, 0.0]), "N": np.array([0.0, 1.0]), "S": np.array([0.0, -1.0])}
    step = {"E": (1, 0), "W": (-1, 0), "N": (0, 1), "S": (0, -1)}

    def arms_of(i: int, j: int) -> list[str]:
        return [k for k, (di, dj) in step.items() if 0 <= i + di < n and 0 <= j + dj < n]

    road_polys: list[Polygon] = []
    road_segment_of_intersection: dict[tuple[int, int], str] = {}
    seg_polys_tokens: list[tuple[Polygon, str, bool]] = []
    for (i, j), c in centres.items():
        arm_vecs = [dirs[k] for k in arms_of(i, j)]
        poly = _intersection_polygon(c, arm_vecs)
        road_polys.append(poly)
        seg_polys_tokens.append((poly, mb.token("road_segment"), True))
        road_segment_of_intersection[(i, j)] = seg_polys_tokens[-1][1]

    # Road stretches between neighbouring intersections (each stored once, from lower to higher index).
    lanes: dict[str, LanePath] = {}
    white: list[np.ndarray] = []
    yellow: list[np.ndarray] = []
    # incoming[(i, j)][arm] -> list of (lane token, offset); outgoing likewise (lane leaving via arm)
    incoming: dict[tuple[int, int], dict[str, list[tuple[str, float]]]] = {k: {} for k in centres}
    outgoing: dict[tuple[int, int], dict[str, list[tuple[str, float]]]] = {k: {} for k in centres}
    road_block_in: dict[tuple[tuple[int, int], str], str] = {}
    lane_tokens_by_segment: dict[str, list[str]] = {}
    curb_sites: list[tuple[float, float, float]] = []
    opposite = {"E": "W", "W": "E", "N": "S", "S": "N"}
    for (i, j), c in centres.items():
        for arm in ("E", "N"):
            di, dj = step[arm]
            if (i + di, j + dj) not in centres:
                continue
            c2 = centres[(i + di, j + dj)]
            u = dirs[arm]
            a = c + u * INTERSECTION_HALF
            b = c2 - u * INTERSECTION_HALF
            length = float(np.linalg.norm(b - a))
            seg_poly = Polygon(_rect(a, u, 0.0, length, -ROAD_HALF, ROAD_HALF))
            road_polys.append(seg_poly)
            seg_tok = mb.token("road_segment")
            seg_polys_tokens.append((seg_poly, seg_tok, False))
            n_left = _left(u)
            # dividers: centre (road_divider) and one lane divider per direction
            centre_line = np.array([a, b])
            rd_line, _ = mb.line(np.array([a + u * s for s in np.linspace(0, length, 5)]))
            mb.add("road_divider", {"line_token": rd_line, "road_segment_token": seg_tok})
            for w in (-0.1, 0.1):
                yellow.append(_rect(a + n_left * w, u, 0.0, length, -0.06, 0.06))
            divider_nodes = {}
            for side in (-1.0, 1.0):
                off = side * LANE_WIDTH
                pts = np.array([a + n_left * off + u * s for s in np.linspace(0, length, 5)])
                ln_tok, nodes = mb.line(pts)
                mb.add(
                    "lane_divider",
                    {"line_token": ln_tok,
                     "lane_divider_segments": [{"node_token": t, "segment_type": "DOUBLE_DASHED_WHITE"} for t in nodes]},
                )
                divider_nodes[side] = nodes
                white.extend(_dashes(pts[0], pts[-1], 0.15, 3.0, 6.0))
            centre_nodes = [mb.node(p) for p in centre_line]
            edge_nodes = {side: [mb.node(a + n_left * side * ROAD_HALF), mb.node(b + n_left * side * ROAD_HALF)]
                          for side in (-1.0, 1.0)}
            edge_start, _ = mb.line(np.array([a - n_left * ROAD_HALF, a + n_left * ROAD_HALF]))
            edge_end, _ = mb.line(np.array([b - n_left * ROAD_HALF, b + n_left * ROAD_HALF]))
            seg_lanes = []
            # forward direction (u) drives on the right: -n_left side; backward on +n_left side
            for direction, side, start, end, from_ij, to_ij, arm_out, arm_in in (
                (u, -1.0, a, b, (i, j), (i + di, j + dj), arm, opposite[arm]),
                (-u, 1.0, b, a, (i + di, j + dj), (i, j), opposite[arm], arm),
            ):
                block_poly = Polygon(_rect(a, u, 0.0, length, min(0.0, side * ROAD_HALF), max(0.0, side * ROAD_HALF)))
                rb_tok = mb.add(
                    "road_block",
                    {"polygon_token": mb.polygon(block_poly),
                     "from_edge_line_token": edge_start if side < 0 else edge_end,
                     "to_edge_line_token": edge_end if side < 0 else edge_start,
                     "road_segment_token": seg_tok},
                )
                road_block_in[(to_ij, arm_in)] = rb_tok
                for k, off in enumerate(LANE_OFFSETS):
                    centre_pts = np.array([start + n_left * side * off, end + n_left * side * off])
                    lane_poly = Polygon(_rect(a, u, 0.0, length, *sorted((side * (off - 1.75), side * (off + 1.75)))))
                    tok = mb.token("lane")
                    inner = k == 0
                    left_nodes = centre_nodes if inner else divider_nodes[side]
                    right_nodes = divider_nodes[side] if inner else edge_nodes[side]
                    left_type = "DOUBLE_SOLID_YELLOW" if inner else "DOUBLE_DASHED_WHITE"
                    right_type = "DOUBLE_DASHED_WHITE" if inner else "NIL"
                    mb.add(
                        "lane",
                        {"token": tok, "polygon_token": mb.polygon(lane_poly), "lane_type": "CAR",
                         "from_edge_line_token": edge_start if side < 0 else edge_end,
                         "to_edge_line_token": edge_end if side < 0 else edge_start,
                         "left_lane_divider_segments": [{"node_token": t, "segment_type": left_type} for t in left_nodes],
                         "right_lane_divider_segments": [{"node_token": t, "segment_type": right_type} for t in right_nodes]},
                    )
                    yaw = _yaw(direction)
                    mb.arcline_path_3[tok] = [{
                        "start_pose": [float(centre_pts[0][0]), float(centre_pts[0][1]), yaw],
                        "end_pose": [float(centre_pts[1][0]), float(centre_pts[1][1]), yaw],
                        "shape": "LSR", "radius": 999.999, "segment_length": [0.0, length, 0.0],
                    }]
                    dense = np.linspace(centre_pts[0], centre_pts[1], max(2, int(length // 2) + 1))
                    lanes[tok] = LanePath(tok, dense, is_connector=False, outer=not inner)
                    outgoing[from_ij].setdefault(arm_out, []).append((tok, off))
                    incoming[to_ij].setdefault(arm_in, []).append((tok, off))
                    seg_lanes.append(tok)
                # curb sites for cones and barriers: on the sidewalk, just behind the curb
                for s in np.arange(12.0, length - 12.0, 3.0):
                    p = start + direction * s + n_left * side * (ROAD_HALF + 0.35)
                    curb_sites.append((p[0], p[1], yaw))
            lane_tokens_by_segment[seg_tok] = seg_lanes

    # Lane connectors through intersections.
    for (i, j), c in centres.items():
        arms = arms_of(i, j)
        for arm_in, lanes_in in incoming[(i, j)].items():
            heading = -dirs[arm_in]  # travel direction when entering from that arm
            options = {"straight": opposite[arm_in]}
            for turn, rot in (("left", _left), ("right", _right)):
                vec = rot(heading)
                options[turn] = next(k for k, v in dirs.items() if np.allclose(v, vec))
            for tok_in, off in lanes_in:
                wanted = ["straight", "left"] if off == LANE_OFFSETS[0] else ["straight", "right"]
                choices = [t for t in wanted if options[t] in arms]
                if not choices:
                    choices = [t for t in ("straight", "left", "right") if options[t] in arms]
                for turn in choices:
                    arm_out = options[turn]
                    tok_out = next(t for t, o in outgoing[(i, j)][arm_out] if o == off)
                    p0 = lanes[tok_in].xy[-1]
                    p1 = lanes[tok_out].xy[0]
                    if turn == "straight":
                        xy = np.linspace(p0, p1, 13)
                        arc = {"shape": "LSR", "radius": 999.999,
                               "segment_length": [0.0, float(np.linalg.norm(p1 - p0)), 0.0]}
                        end_heading = heading
                    else:
                        radius = INTERSECTION_HALF + off if turn == "left" else INTERSECTION_HALF - off
                        xy = _quarter_arc(p0, heading, radius, left=turn == "left")
                        xy[-1] = p1
                        arc = {"shape": "LSL" if turn == "left" else "RSR", "radius": float(radius),
                               "segment_length": [float(radius * math.pi / 2), 0.0, 0.0]}
                        end_heading = _left(heading) if turn == "left" else _right(heading)
                    ctok = mb.token("lane_connector")
                    poly = LineString(xy).buffer(LANE_WIDTH / 2, cap_style="flat", quad_segs=4)
                    mb.add("lane_connector", {"token": ctok, "polygon_token": mb.polygon(poly)})
                    arc.update(start_pose=[float(p0[0]), float(p0[1]), _yaw(heading)],
                               end_pose=[float(p1[0]), float(p1[1]), _yaw(end_heading)])
                    mb.arcline_path_3[ctok] = [arc]
                    lanes[ctok] = LanePath(ctok, xy, is_connector=True, turn=turn)
                    lanes[tok_in].outgoing.append(ctok)
                    lanes[ctok].incoming.append(tok_in)
                    lanes[ctok].outgoing.append(tok_out)
                    lanes[tok_out].incoming.append(ctok)
    for tok, lane in lanes.items():
        mb.connectivity[tok] = {"incoming": list(lane.incoming), "outgoing": list(lane.outgoing)}

    # Drivable area (one polygon with the blocks as holes) and the road segments pointing at it.
    drivable = unary_union(road_polys)
    da_polys = list(drivable.geoms) if isinstance(drivable, MultiPolygon) else [drivable]
    da_tok = mb.add("drivable_area", {"polygon_tokens": [mb.polygon(p) for p in da_polys]})
    for poly, tok, is_int in seg_polys_tokens:
        mb.add("road_segment", {"token": tok, "polygon_token": mb.polygon(poly), "is_intersection": is_int,
                                "drivable_area_token": da_tok})

    # Ped crossings, stop lines and traffic lights on every arm.
    stripes: list[np.ndarray] = []
    crossing_paths: list[np.ndarray] = []
    for (i, j), c in centres.items():
        for arm in arms_of(i, j):
            d = dirs[arm]
            band = Polygon(_rect(c, d, *CROSSING_BAND, -ROAD_HALF, ROAD_HALF))
            pc_tok = mb.add("ped_crossing", {"polygon_token": mb.polygon(band),
                                             "road_segment_token": road_segment_of_intersection[(i, j)]})
            for w in np.arange(-ROAD_HALF + 0.25, ROAD_HALF, 1.0):
                stripes.append(_rect(c, d, CROSSING_BAND[0] + 0.2, CROSSING_BAND[1] - 0.2, w, w + 0.5))
            mid = c + d * sum(CROSSING_BAND) / 2
            crossing_paths.append(np.array([mid - _left(d) * (ROAD_HALF + 1.5), mid + _left(d) * (ROAD_HALF + 1.5)]))
            stop = Polygon(_rect(c, d, *STOP_LINE_BAND, 0.2, ROAD_HALF - 0.2))
            white.append(np.asarray(stop.exterior.coords)[:4])
            rb_tok = road_block_in.get(((i, j), arm), "")
            tl_line, _ = mb.line(np.array([c + d * 12.5 + _left(d) * (ROAD_HALF + 0.5),
                                           c + d * 12.5 + _left(d) * (ROAD_HALF + 1.0)]))
            tl_pos = c + d * 12.5 + _left(d) * (ROAD_HALF + 0.7)
            tl_tok = mb.add("traffic_light", {
                "line_token": tl_line, "traffic_light_type": "VERTICAL", "from_road_block_token": rb_tok,
                "items": [{"color": "RED", "shape": "CIRCLE",
                           "rel_pos": {"tx": 0.0, "ty": 0.0, "tz": 0.6, "rx": 0.0, "ry": 0.0, "rz": 0.0},
                           "to_road_block_tokens": []}],
                "pose": {"tx": float(tl_pos[0]), "ty": float(tl_pos[1]), "tz": 4.5, "rx": 0.0, "ry": 0.0,
                         "rz": _yaw(-d)},
            })
            mb.add("stop_line", {"polygon_token": mb.polygon(stop), "stop_line_type": "PED_CROSSING",
                                 "ped_crossing_tokens": [pc_tok], "traffic_light_tokens": [tl_tok],
                                 "road_block_token": rb_tok})

    # Blocks: sidewalk ring, interior with buildings, courtyards with trees, some car parks.
    lo, hi = coords[0] - ROAD_HALF, coords[-1] + ROAD_HALF
    walkways: list[Polygon] = []
    interiors: list[Polygon] = []
    carparks: list[Polygon] = []
    buildings: list[list[float]] = []
    trees: list[list[float]] = []
    loops: list[np.ndarray] = []
    spots: list[tuple[float, float, float]] = []
    any_block = next(iter(road_block_in.values()))
    blocks = [box(coords[i] + ROAD_HALF, coords[j] + ROAD_HALF, coords[i + 1] - ROAD_HALF, coords[j + 1] - ROAD_HALF)
              for i in range(n - 1) for j in range(n - 1)]
    outer = box(lo - SIDEWALK, lo - SIDEWALK, hi + SIDEWALK, hi + SIDEWALK).difference(box(lo, lo, hi, hi))
    for b_idx, block in enumerate(blocks):
        last_chance = b_idx == len(blocks) - 1 and not carparks  # every map gets at least one car park
        outer_block = block.difference(drivable)
        inner = block.buffer(-SIDEWALK, join_style="mitre")
        walk = outer_block.difference(inner)
        walkways.append(walk)
        interiors.append(inner)
        walk_mid = block.buffer(-SIDEWALK / 2, join_style="mitre")
        loops.append(np.asarray(walk_mid.exterior.coords))
        x0, y0, x1, y1 = inner.bounds
        _place_buildings(rng, (x0, y0, x1, y1), buildings, depth=(10.0, 18.0))
        core = (x0 + 20.0, y0 + 20.0, x1 - 20.0, y1 - 20.0)
        if core[2] - core[0] > 10 and (rng.random() < 0.4 or last_chance):
            cp = box(*core)
            carparks.append(cp)
            for yy in np.arange(core[1] + 3.0, core[3] - 2.0, 6.0):
                for xx in np.arange(core[0] + 2.0, core[2] - 1.5, 2.8):
                    spots.append((xx, yy, math.pi / 2 * (1 if rng.random() < 0.5 else -1)))
        elif core[2] - core[0] > 4:
            for _ in range(int(rng.integers(3, 9))):
                trees.append([rng.uniform(core[0], core[2]), rng.uniform(core[1], core[3]),
                              rng.uniform(1.8, 3.2), rng.uniform(6.0, 10.0)])
        # street trees close to the curb
        ring = LineString(block.buffer(-0.9, join_style="mitre").exterior.coords)
        for s in np.arange(rng.uniform(3, 9), ring.length, rng.uniform(14.0, 22.0)):
            p = ring.interpolate(s)
            if drivable.distance(p) > 0.6:
                trees.append([p.x, p.y, rng.uniform(1.2, 2.0), rng.uniform(5.0, 7.5)])
    walkways.append(outer)
    loops.append(np.asarray(box(lo - SIDEWALK / 2, lo - SIDEWALK / 2, hi + SIDEWALK / 2, hi + SIDEWALK / 2).exterior.coords))
    ring_lo, ring_hi = lo - SIDEWALK - 1.0, hi + SIDEWALK + 1.0
    for x0, y0, x1, y1 in (
        (ring_lo - 18.0, ring_lo - 18.0, ring_hi + 18.0, ring_lo),
        (ring_lo - 18.0, ring_hi, ring_hi + 18.0, ring_hi + 18.0),
        (ring_lo - 18.0, ring_lo, ring_lo, ring_hi),
        (ring_hi, ring_lo, ring_hi + 18.0, ring_hi),
    ):
        strip: list[list[float]] = []
        _place_buildings(rng, (x0, y0, x1, y1), strip, depth=(12.0, 18.0), single_row=True)
        buildings.extend(strip)
    for walk in walkways:
        mb.add("walkway", {"polygon_token": mb.polygon(walk)})
    for cp in carparks:
        mb.add("carpark_area", {"polygon_token": mb.polygon(cp), "orientation": 0.0,
                                "road_block_token": any_block})
    canvas = (float(hi + MAP_MARGIN + 30.0), float(hi + MAP_MARGIN + 30.0))
    bld = np.array(buildings, dtype=np.float64).reshape(-1, 5)
    palette = np.array([[170, 180, 190], [120, 130, 150], [90, 110, 140], [190, 190, 180], [140, 150, 160],
                        [100, 120, 110], [160, 140, 120], [200, 205, 210]], dtype=np.uint8)
    colors = palette[rng.integers(0, len(palette), len(bld))]
    return CityMap(
        location=location,
        canvas=canvas,
        expansion=mb.to_json(canvas),
        lanes=lanes,
        road_polygons=road_polys,
        drivable=drivable,
        walkways=walkways,
        block_interiors=interiors,
        carparks=carparks,
        crossing_stripes=np.array(stripes),
        white_markings=np.array(white),
        yellow_markings=np.array(yellow),
        buildings=bld,
        building_colors=colors,
        trees=np.array(trees, dtype=np.float64).reshape(-1, 4),
        sidewalk_loops=loops,
        crossing_paths=crossing_paths,
        parking_spots=np.array(spots, dtype=np.float64).reshape(-1, 3),
        curb_sites=np.array(curb_sites, dtype=np.float64).reshape(-1, 3),
        lane_tokens_by_segment=lane_tokens_by_segment,
    )


def _place_buildings(
    rng: np.random.Generator,
    bounds: tuple[float, float, float, float],
    out: list[list[float]],
    depth: tuple[float, float],
    single_row: bool = False,
) -> None:
    """Buildings along the edges of a rectangle, with gaps, facing outward."""
    x0, y0, x1, y1 = bounds
    if single_row:
        horizontal = (x1 - x0) >= (y1 - y0)
        length = (x1 - x0) if horizontal else (y1 - y0)
        s = rng.uniform(0, 6)
        while s < length - 8:
            w = rng.uniform(14, 36)
            e = min(s + w, length)
            h = rng.uniform(8, 40)
            if horizontal:
                out.append([x0 + s, y0, x0 + e, y1, h])
            else:
                out.append([x0, y0 + s, x1, y0 + e, h])
            s = e + rng.uniform(3, 10)
        return
    d = min(rng.uniform(*depth), (x1 - x0) / 2 - 1, (y1 - y0) / 2 - 1)
    if d < 4:
        return
    # south and north rows span the width; west and east rows fill between them
    for yy0, yy1 in ((y0, y0 + d), (y1 - d, y1)):
        s = x0 + rng.uniform(0, 3)
        while s < x1 - 6:
            e = min(s + rng.uniform(14, 34), x1)
            out.append([s, yy0, e, yy1, rng.uniform(8, 40)])
            s = e + rng.uniform(3, 8)
    for xx0, xx1 in ((x0, x0 + d), (x1 - d, x1)):
        s = y0 + d + rng.uniform(3, 6)
        while s < y1 - d - 6:
            e = min(s + rng.uniform(14, 30), y1 - d - 3)
            if e - s > 5:
                out.append([xx0, s, xx1, e, rng.uniform(8, 40)])
            s = e + rng.uniform(3, 8)


# Ground classes used by the rasters (LiDAR intensity, occupancy, the map mask).
GROUND_TERRAIN, GROUND_ROAD, GROUND_SIDEWALK, GROUND_CROSSING, GROUND_MARKING, GROUND_CARPARK, GROUND_BUILDING = range(7)


@dataclass
class GroundRaster:
    """Per-location raster of ground classes and building edges, for lookups in bulk."""

    classes: np.ndarray  # (H, W) uint8, row 0 at y = 0
    building_edge: np.ndarray  # (H, W) float32 building height on footprint borders, else 0
    resolution: float

    def lookup(self, xy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        col = np.clip((xy[..., 0] / self.resolution).astype(np.int64), 0, self.classes.shape[1] - 1)
        row = np.clip((xy[..., 1] / self.resolution).astype(np.int64), 0, self.classes.shape[0] - 1)
        return self.classes[row, col], self.building_edge[row, col]


def _fill(img: np.ndarray, polys: list[np.ndarray], value: float, res: float) -> None:
    pts = [np.round(np.asarray(p)[:, :2] / res * 16).astype(np.int32) for p in polys if len(p) >= 3]
    if pts:
        cv2.fillPoly(img, pts, value, lineType=cv2.LINE_8, shift=4)


def _polygon_rings(geom: Polygon | MultiPolygon) -> tuple[list[np.ndarray], list[np.ndarray]]:
    polys = list(geom.geoms) if hasattr(geom, "geoms") else [geom]
    ext = [np.asarray(p.exterior.coords) for p in polys if not p.is_empty]
    holes = [np.asarray(h.coords) for p in polys if not p.is_empty for h in p.interiors]
    return ext, holes


def build_ground_raster(city: CityMap, resolution: float = 0.2) -> GroundRaster:
    w = int(math.ceil(city.canvas[0] / resolution))
    h = int(math.ceil(city.canvas[1] / resolution))
    cls = np.full((h, w), GROUND_TERRAIN, np.uint8)
    for walk in city.walkways:
        ext, holes = _polygon_rings(walk)
        _fill(cls, ext, GROUND_SIDEWALK, resolution)
        _fill(cls, holes, GROUND_TERRAIN, resolution)
    for cp in city.carparks:
        _fill(cls, _polygon_rings(cp)[0], GROUND_CARPARK, resolution)
    ext, holes = _polygon_rings(city.drivable)
    _fill(cls, ext, GROUND_ROAD, resolution)
    _fill(cls, holes, GROUND_TERRAIN, resolution)
    for walk in city.walkways[:-1]:  # block sidewalks re-drawn where the hole fill overwrote them
        ext, holes = _polygon_rings(walk)
        _fill(cls, ext, GROUND_SIDEWALK, resolution)
        _fill(cls, holes, GROUND_TERRAIN, resolution)
    for cp in city.carparks:
        _fill(cls, _polygon_rings(cp)[0], GROUND_CARPARK, resolution)
    _fill(cls, list(city.crossing_stripes), GROUND_CROSSING, resolution)
    _fill(cls, list(city.white_markings) + list(city.yellow_markings), GROUND_MARKING, resolution)
    edge = np.zeros((h, w), np.float32)
    for x0, y0, x1, y1, height in city.buildings:
        rect = np.array([[x0, y0], [x1, y0], [x1, y1], [x0, y1]])
        _fill(cls, [rect], GROUND_BUILDING, resolution)
        pts = np.round(rect / resolution * 16).astype(np.int32)
        cv2.polylines(edge, [pts], True, float(height), thickness=max(1, int(round(0.6 / resolution))), shift=4)
    return GroundRaster(cls, edge, resolution)


def write_map_files(city: CityMap, root: Path, map_token: str) -> None:
    """``maps/expansion/<location>.json`` and the semantic-prior mask ``maps/<token>.png`` (10 px/m)."""
    exp_dir = root / "maps" / "expansion"
    exp_dir.mkdir(parents=True, exist_ok=True)
    tmp = exp_dir / f".{city.location}.json.tmp"
    tmp.write_text(json.dumps(city.expansion, separators=(",", ":")))
    tmp.replace(exp_dir / f"{city.location}.json")
    res = 0.1
    w = int(math.ceil(city.canvas[0] / res))
    h = int(math.ceil(city.canvas[1] / res))
    mask = np.zeros((h, w), np.uint8)
    ext, holes = _polygon_rings(city.drivable)
    _fill(mask, ext, 255, res)
    _fill(mask, holes, 0, res)
    for walk in city.walkways:
        e, hl = _polygon_rings(walk)
        _fill(mask, e, 255, res)
        _fill(mask, hl, 0, res)
    # The devkit's MapMask puts image row 0 at the top (max y): flip so north is up. (PIL's PNG
    # encoder at level 1 is about twice as fast as cv2's on these mostly-empty masks.)
    from PIL import Image

    Image.fromarray(np.ascontiguousarray(mask[::-1])).save(root / "maps" / f"{map_token}.png", compress_level=1)
