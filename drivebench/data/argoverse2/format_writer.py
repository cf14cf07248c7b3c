"""Write a synthetic scenario in the real Argoverse 2 files: scenario parquet + map JSON.

Why here and not through av2's serializer: av2's writer goes through per-state Python objects
(slow) and leaves column types to pandas; writing Arrow arrays directly is fast and pins the
column order and types that ``schema.PARQUET_COLUMNS`` documents. Everything is moved from the
generator's local frame into a city frame (rotation, offsets of kilometres, a ground-height
field for map z) as real data is.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from drivebench.data.argoverse2 import schema
from drivebench.data.argoverse2.synthetic_map import Lane, RoadNetwork, left_normals, wrap_angle
from drivebench.data.argoverse2.synthetic_traffic import Track
from drivebench.polylines import resample_many


@dataclass(frozen=True)
class CityFrame:
    """Local (generator) frame -> city frame, plus the ground height used for map z."""

    yaw: float
    origin: tuple[float, float]
    ground: tuple[float, float, float]  # z = ground[0] + ground[1] * x_local + ground[2] * y_local

    @staticmethod
    def random(rng: np.random.Generator) -> "CityFrame":
        sign = rng.choice([-1.0, 1.0], size=2)
        origin = sign * rng.uniform(800.0, 7000.0, size=2)
        return CityFrame(yaw=float(rng.uniform(-math.pi, math.pi)), origin=(float(origin[0]), float(origin[1])),
                         ground=(float(rng.uniform(0.0, 60.0)), *map(float, rng.uniform(-0.02, 0.02, size=2))))

    def points(self, local: np.ndarray) -> np.ndarray:
        c, s = math.cos(self.yaw), math.sin(self.yaw)
        x = c * local[:, 0] - s * local[:, 1] + self.origin[0]
        y = s * local[:, 0] + c * local[:, 1] + self.origin[1]
        return np.stack([x, y], axis=-1)

    def vectors(self, local: np.ndarray) -> np.ndarray:
        c, s = math.cos(self.yaw), math.sin(self.yaw)
        return np.stack([c * local[:, 0] - s * local[:, 1], s * local[:, 0] + c * local[:, 1]], axis=-1)

    def headings(self, local: np.ndarray) -> np.ndarray:
        return (local + self.yaw + math.pi) % (2 * math.pi) - math.pi

    def points_3d(self, polylines: list[np.ndarray]) -> list[list[dict[str, float]]]:
        """Map vertices as av2 JSON expects them (centimetre precision, like released maps).

        Batched over many polylines: one transform and one ``tolist`` for the whole map.
        """
        local = np.concatenate(polylines)
        xy = self.points(local)
        z = self.ground[0] + self.ground[1] * local[:, 0] + self.ground[2] * local[:, 1]
        flat = [{"x": x, "y": y, "z": zz} for x, y, zz in np.column_stack([xy, z]).round(2).tolist()]
        bounds = np.cumsum([0] + [len(p) for p in polylines]).tolist()
        return [flat[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


# --- map JSON ---------------------------------------------------------------------------
def _lane_polylines(lanes: list[Lane], center_spacing: float) -> tuple[list, list, list]:
    """Sparse centerlines and boundaries: straight boundaries keep their ends only, curves more.

    Vectorised over all lanes (a map has hundreds; per-lane numpy calls would dominate).
    """
    sizes = np.array([len(lane.center) for lane in lanes])
    starts = np.cumsum(sizes) - sizes
    center = np.concatenate([lane.center for lane in lanes])
    heading = np.concatenate([lane.heading for lane in lanes])  # heading[k] = segment k -> k+1
    # Total turn per lane: wrapped heading steps between its segments.
    step = wrap_angle(np.diff(heading))
    step[starts[1:] - 1] = 0.0  # across two lanes
    step_owner = np.repeat(np.arange(len(lanes)), sizes)[:-1]
    inner = np.ones(len(step), bool)
    inner[np.concatenate([starts[1:] - 2, starts[1:] - 1])] = False  # the repeated last heading
    turns = np.abs(np.bincount(step_owner[inner], weights=step[inner], minlength=len(lanes)))
    turn_points = np.ceil(np.degrees(turns) / 12.0).astype(np.int64)
    lengths = np.array([lane.length for lane in lanes])
    n_center = np.maximum(np.maximum(np.ceil(lengths / center_spacing).astype(np.int64) + 1, 2 + turn_points), 2)
    n_boundary = 2 + turn_points
    # Normal at each point: the bisector of the segments before and after it.
    before = np.roll(heading, 1)
    before[starts] = heading[starts]
    bisector = before + 0.5 * wrap_angle(heading - before)
    offset = np.repeat(np.array([lane.half_width for lane in lanes]), sizes)[:, None] * left_normals(bisector)
    split = np.cumsum(sizes)[:-1]
    lefts, rights = np.split(center + offset, split), np.split(center - offset, split)
    return (resample_many([lane.center for lane in lanes], n_center), resample_many(lefts, n_boundary),
            resample_many(rights, n_boundary))


def map_json(net: RoadNetwork, frame: CityFrame, rng: np.random.Generator, center_spacing: float) -> dict:
    """The ``log_map_archive_<id>.json`` content of a network."""
    lane_ids = int(rng.integers(100_000_000, 400_000_000)) + np.cumsum(rng.integers(1, 40, size=len(net.lanes)))
    lane_id = [int(i) for i in lane_ids]

    def ref(index: int | None) -> int | None:
        return None if index is None else lane_id[index]

    centers, lefts, rights = _lane_polylines(net.lanes, center_spacing)
    n_lanes, n_crossings = len(net.lanes), len(net.crosswalks)
    edges = [c.edge1 for c in net.crosswalks] + [c.edge2 for c in net.crosswalks]
    vertices = frame.points_3d(centers + lefts + rights + edges + list(net.drivable_areas))
    centers_3d, lefts_3d = vertices[:n_lanes], vertices[n_lanes: 2 * n_lanes]
    rights_3d, rest = vertices[2 * n_lanes: 3 * n_lanes], vertices[3 * n_lanes:]
    edge1_3d, edge2_3d, areas_3d = rest[:n_crossings], rest[n_crossings: 2 * n_crossings], rest[2 * n_crossings:]

    lane_segments = {}
    for lane in net.lanes:
        k = lane.index
        lane_segments[str(lane_id[k])] = {
            "centerline": centers_3d[k],
            "id": lane_id[k],
            "is_intersection": lane.is_intersection,
            "lane_type": lane.lane_type,
            "left_lane_boundary": lefts_3d[k],
            "left_lane_mark_type": lane.left_mark,
            "left_neighbor_id": ref(lane.left_neighbor),
            "predecessors": [lane_id[i] for i in lane.predecessors],
            "right_lane_boundary": rights_3d[k],
            "right_lane_mark_type": lane.right_mark,
            "right_neighbor_id": ref(lane.right_neighbor),
            "successors": [lane_id[i] for i in lane.successors],
        }
    crossing_base = int(rng.integers(1_000_000, 30_000_000))
    pedestrian_crossings = {
        str(crossing_base + 7 * k): {"edge1": edge1_3d[k], "edge2": edge2_3d[k], "id": crossing_base + 7 * k}
        for k in range(n_crossings)
    }
    area_base = int(rng.integers(1_000_000, 30_000_000))
    drivable_areas = {
        str(area_base + 3 * k): {"area_boundary": area, "id": area_base + 3 * k} for k, area in enumerate(areas_3d)
    }
    return {"drivable_areas": drivable_areas, "lane_segments": lane_segments,
            "pedestrian_crossings": pedestrian_crossings}


# --- scenario parquet -------------------------------------------------------------------
_ARROW_TYPES = {"bool": pa.bool_(), "string": pa.string(), "int64": pa.int64(), "double": pa.float64(),
                "uint64": pa.uint64()}
PARQUET_SCHEMA = pa.schema([(name, _ARROW_TYPES[kind]) for name, kind in schema.PARQUET_COLUMNS])


@dataclass(frozen=True)
class ScenarioMeta:
    scenario_id: str
    city: str
    start_timestamp_ns: int
    map_id: int
    slice_id: str


def tracks_table(tracks: list[Track], meta: ScenarioMeta, frame: CityFrame) -> pa.Table:
    """One row per (track, timestep), tracks sorted by id ("AV" last), timesteps ascending."""
    tracks = sorted(tracks, key=lambda t: t.track_id)
    counts = [len(t.steps) for t in tracks]
    rows = int(sum(counts))
    steps = np.concatenate([t.steps for t in tracks]).astype(np.int64)
    position = frame.points(np.concatenate([t.position for t in tracks]))
    velocity = frame.vectors(np.concatenate([t.velocity for t in tracks]))
    heading = frame.headings(np.concatenate([t.heading for t in tracks]))
    end_ns = meta.start_timestamp_ns + (schema.NUM_STEPS - 1) * 100_000_000

    owner = pa.array(np.repeat(np.arange(len(tracks)), counts))
    constant = pa.array(np.zeros(rows, dtype=np.int64))

    def per_track(values: list[str]) -> pa.Array:
        return pa.array(values, type=pa.string()).take(owner)

    def per_row(value: str) -> pa.Array:
        return pa.array([value], type=pa.string()).take(constant)

    focal = next(t.track_id for t in tracks if t.category == 3)
    columns = {
        "observed": pa.array(steps < schema.NUM_HISTORICAL_STEPS),
        "track_id": per_track([t.track_id for t in tracks]),
        "object_type": per_track([t.object_type for t in tracks]),
        "object_category": pa.array(np.repeat(np.array([t.category for t in tracks], dtype=np.int64), counts)),
        "timestep": pa.array(steps),
        "position_x": pa.array(position[:, 0]),
        "position_y": pa.array(position[:, 1]),
        "heading": pa.array(heading),
        "velocity_x": pa.array(velocity[:, 0]),
        "velocity_y": pa.array(velocity[:, 1]),
        "scenario_id": per_row(meta.scenario_id),
        "start_timestamp": pa.array(np.full(rows, float(meta.start_timestamp_ns))),
        "end_timestamp": pa.array(np.full(rows, float(end_ns))),
        "num_timestamps": pa.array(np.full(rows, schema.NUM_STEPS, dtype=np.int64)),
        "focal_track_id": per_row(focal),
        "city": per_row(meta.city),
        "map_id": pa.array(np.full(rows, meta.map_id, dtype=np.uint64)),
        "slice_id": per_row(meta.slice_id),
    }
    arrays = [columns[field.name] for field in PARQUET_SCHEMA]
    return pa.Table.from_arrays(arrays, schema=PARQUET_SCHEMA)


def write_scenario(directory: Path, meta: ScenarioMeta, tracks: list[Track], map_content: dict,
                   frame: CityFrame) -> None:
    """``<directory>/scenario_<id>.parquet`` and ``log_map_archive_<id>.json``."""
    directory.mkdir(parents=True, exist_ok=True)
    strings = [name for name, kind in schema.PARQUET_COLUMNS if kind == "string"]
    pq.write_table(tracks_table(tracks, meta, frame), directory / schema.scenario_parquet_name(meta.scenario_id),
                   use_dictionary=strings, write_statistics=False)
    # json.dumps uses the C encoder; json.dump to a file would take the slow Python one.
    (directory / schema.map_json_name(meta.scenario_id)).write_text(json.dumps(map_content, separators=(",", ":")))
