"""Argoverse 2 motion-forecasting files -> RawScenario (see ``schema`` for the structure).

Why a converter of our own: QCNet's upstream ``process()`` is the reference for what the model
sees (which agents, which steps are valid, how map polygons become point vectors and graph
edges), but it writes torch tensors through PyG. This module produces the same arrays as numpy
so that the preprocessing cache is framework-free and the model's transform decides the rest.

Differences from upstream that are deliberate: geometry differences are taken in float64 before
the cast to float32 (upstream casts first, which loses centimetres at city-frame coordinates of
several kilometres); a lane without a ``centerline`` in the JSON gets av2's midpoint centerline
instead of a KeyError; the test-split predict rule applies when the parquet has no future rows.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from drivebench.data.argoverse2 import schema
from drivebench.errors import DataError, MissingDataError

CONVERTER_VERSION = "av2-raw-1"

_AGENT_TYPE_CODE = {name: i for i, name in enumerate(schema.AGENT_TYPES)}
_POINT_TYPE_CODE = {name: i for i, name in enumerate(schema.POINT_TYPES)}
_POLYGON_TYPE_CODE = {name: i for i, name in enumerate(schema.POLYGON_TYPES)}
_INTERSECTION_CODE = {value: i for i, value in enumerate(schema.POLYGON_IS_INTERSECTION)}
_SIDE_LEFT, _SIDE_RIGHT, _SIDE_CENTER = (schema.POINT_SIDES.index(s) for s in ("LEFT", "RIGHT", "CENTER"))
_EDGE_CODE = {name: i for i, name in enumerate(schema.POLYGON_TO_POLYGON_TYPES)}
_NEEDED_COLUMNS = (
    "track_id", "object_type", "object_category", "timestep", "position_x", "position_y",
    "heading", "velocity_x", "velocity_y", "scenario_id", "city",
)


class Argoverse2FormatError(DataError, ValueError):
    """A file or directory is not in the Argoverse 2 motion-forecasting format."""


def scenario_files(scenario_dir: Path) -> tuple[Path, Path]:
    """The parquet and map paths of one scenario directory, or a one-line error naming what is missing."""
    scenario_dir = Path(scenario_dir)
    scenario_id = scenario_dir.name
    if not scenario_dir.is_dir():
        raise MissingDataError(
            f"scenario directory {scenario_dir} does not exist: expected {schema.LAYOUT_HINT}"
        )
    parquet = scenario_dir / schema.scenario_parquet_name(scenario_id)
    map_json = scenario_dir / schema.map_json_name(scenario_id)
    for path in (parquet, map_json):
        if not path.is_file():
            raise MissingDataError(
                f"{scenario_dir} does not look like an Argoverse 2 motion-forecasting scenario: "
                f"expected {path} (layout {schema.LAYOUT_HINT})"
            )
    return parquet, map_json


def load_scenario_dir(scenario_dir: Path, test_split: bool | None = None) -> dict[str, Any]:
    """Read one ``<split>/<id>/`` directory into a RawScenario.

    ``test_split`` selects upstream's test-split predict mask; None decides from the data (a
    parquet without any future rows is a test scenario).
    """
    parquet, map_json = scenario_files(Path(scenario_dir))
    tracks = _read_tracks(parquet)
    scenario = {
        "scenario_id": str(tracks["scenario_id"].iloc[0]),
        "city": str(tracks["city"].iloc[0]),
        "agent": agent_features(tracks, parquet, test_split),
    }
    scenario.update(map_features(map_json))
    return scenario


def _read_tracks(parquet: Path) -> pd.DataFrame:
    try:
        table = pq.read_table(parquet)
    except Exception as error:  # pyarrow raises several types for damaged files
        raise Argoverse2FormatError(
            f"cannot read {parquet}: not a valid parquet file ({type(error).__name__}: "
            f"{str(error).splitlines()[0] if str(error) else ''}); expected an Argoverse 2 scenario parquet"
        ) from None
    missing = [name for name in _NEEDED_COLUMNS if name not in table.column_names]
    if missing:
        raise Argoverse2FormatError(
            f"{parquet} lacks the Argoverse 2 scenario columns {', '.join(missing)}; "
            f"expected columns {', '.join(name for name, _ in schema.PARQUET_COLUMNS)}"
        )
    if table.num_rows == 0:
        raise Argoverse2FormatError(f"{parquet} has no rows; expected one row per (track, timestep)")
    return table.select(list(_NEEDED_COLUMNS)).to_pandas()


def agent_features(tracks: pd.DataFrame, source: Path, test_split: bool | None) -> dict[str, Any]:
    """Agents seen in the history, with upstream QCNet's masks (``vector_repr=True``)."""
    hist_steps, num_steps = schema.NUM_HISTORICAL_STEPS, schema.NUM_STEPS
    timestep = tracks["timestep"].to_numpy(np.int64)
    if timestep.min() < 0 or timestep.max() >= num_steps:
        raise Argoverse2FormatError(
            f"{source} has timesteps {timestep.min()}..{timestep.max()}; expected 0..{num_steps - 1}"
        )
    track_id = tracks["track_id"].to_numpy(object)
    agent_ids = list(pd.unique(track_id[timestep < hist_steps]))
    if schema.AV_TRACK_ID not in agent_ids:
        raise Argoverse2FormatError(
            f"{source} has no track {schema.AV_TRACK_ID!r} in the first {hist_steps} steps; "
            "expected the ego vehicle's track"
        )
    num_agents = len(agent_ids)
    row_agent = pd.Index(agent_ids).get_indexer(track_id)
    keep = row_agent >= 0
    row_agent, timestep = row_agent[keep], timestep[keep]
    rows = tracks[keep]

    # Per agent, the first of its rows gives type and category (upstream: track_df[...].values[0]).
    first_row = np.full(num_agents, -1, dtype=np.int64)
    first_row[row_agent[::-1]] = np.arange(len(row_agent))[::-1]
    object_type = rows["object_type"].to_numpy(object)[first_row]
    unknown = sorted({str(t) for t in object_type} - set(schema.AGENT_TYPES))
    if unknown:
        raise Argoverse2FormatError(
            f"{source} has object types {unknown}; expected one of {', '.join(schema.AGENT_TYPES)}"
        )
    agent_type = np.array([_AGENT_TYPE_CODE[t] for t in object_type], dtype=np.uint8)
    agent_category = rows["object_category"].to_numpy(np.int64)[first_row].astype(np.uint8)

    present = np.zeros((num_agents, num_steps), dtype=bool)
    present[row_agent, timestep] = True
    position = np.zeros((num_agents, num_steps, 3), dtype=np.float32)
    velocity = np.zeros((num_agents, num_steps, 3), dtype=np.float32)
    heading = np.zeros((num_agents, num_steps), dtype=np.float32)
    position[row_agent, timestep, 0] = rows["position_x"].to_numpy(np.float64)
    position[row_agent, timestep, 1] = rows["position_y"].to_numpy(np.float64)
    velocity[row_agent, timestep, 0] = rows["velocity_x"].to_numpy(np.float64)
    velocity[row_agent, timestep, 1] = rows["velocity_y"].to_numpy(np.float64)
    heading[row_agent, timestep] = rows["heading"].to_numpy(np.float64)

    current_valid = present[:, hist_steps - 1].copy()
    predict_mask = present.copy()
    predict_mask[:, :hist_steps] = False
    predict_mask[~current_valid, hist_steps:] = False
    # A history step is valid only when it and the step before have rows (vector representation).
    valid_mask = present.copy()
    valid_mask[:, 1:hist_steps] = present[:, : hist_steps - 1] & present[:, 1:hist_steps]
    valid_mask[:, 0] = False
    if test_split is None:
        test_split = not bool((timestep >= hist_steps).any())
    if test_split:
        scored = current_valid | (agent_category == 2) | (agent_category == 3)
        predict_mask[scored, hist_steps:] = True

    return {
        "num_nodes": num_agents,
        "av_index": agent_ids.index(schema.AV_TRACK_ID),
        "id": [str(a) for a in agent_ids],
        "type": agent_type,
        "category": agent_category,
        "valid_mask": valid_mask,
        "predict_mask": predict_mask,
        "position": position,
        "heading": heading,
        "velocity": velocity,
    }


def _read_map(map_json: Path) -> tuple[Any, dict[int, np.ndarray]]:
    """av2's map object plus the raw centerlines (av2 does not keep them; QCNet uses them)."""
    from av2.map.map_api import ArgoverseStaticMap

    try:
        raw = json.loads(map_json.read_text())
        lanes = raw["lane_segments"]
        centerlines = {
            lane["id"]: np.array([[p["x"], p["y"], p["z"]] for p in lane["centerline"]], dtype=np.float64)
            for lane in lanes.values()
            if lane.get("centerline")
        }
        static_map = ArgoverseStaticMap.from_json(map_json)
    except (ValueError, KeyError, TypeError, AttributeError, IndexError) as error:
        raise Argoverse2FormatError(
            f"cannot read {map_json} as an Argoverse 2 map ({type(error).__name__}: {error}); expected "
            "JSON with drivable_areas, lane_segments and pedestrian_crossings"
        ) from None
    return static_map, centerlines


def _polyline_vectors(points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Start points and difference vectors of a polyline (N,3) -> (N-1,3), (N-1,3)."""
    return points[:-1], points[1:] - points[:-1]


class _PointBuffer:
    """Collects map points polygon by polygon, in upstream's order."""

    def __init__(self) -> None:
        self.starts: list[np.ndarray] = []
        self.vectors: list[np.ndarray] = []
        self.types: list[np.ndarray] = []
        self.sides: list[np.ndarray] = []
        self.counts: list[int] = []

    def add_polygon(self, polylines: list[tuple[np.ndarray, np.ndarray, int, int]]) -> None:
        """polylines: (starts, vectors, type code, side code) for left, right, centre."""
        count = 0
        for starts, vectors, type_code, side_code in polylines:
            self.starts.append(starts)
            self.vectors.append(vectors)
            self.types.append(np.full(len(vectors), type_code, dtype=np.uint8))
            self.sides.append(np.full(len(vectors), side_code, dtype=np.uint8))
            count += len(vectors)
        self.counts.append(count)

    def arrays(self) -> dict[str, Any]:
        if not self.starts:
            empty = np.zeros((0,), dtype=np.float32)
            return {"num_nodes": 0, "position": np.zeros((0, 3), np.float32), "orientation": empty,
                    "magnitude": empty, "height": empty.copy(), "type": np.zeros((0,), np.uint8),
                    "side": np.zeros((0,), np.uint8)}
        starts = np.concatenate(self.starts)
        vectors = np.concatenate(self.vectors)
        return {
            "num_nodes": len(starts),
            "position": starts.astype(np.float32),
            "orientation": np.arctan2(vectors[:, 1], vectors[:, 0]).astype(np.float32),
            "magnitude": np.hypot(vectors[:, 0], vectors[:, 1]).astype(np.float32),
            "height": vectors[:, 2].astype(np.float32),
            "type": np.concatenate(self.types),
            "side": np.concatenate(self.sides),
        }


def _crosswalk_midline(left: np.ndarray, right: np.ndarray, num_points: int) -> np.ndarray:
    from av2.geometry.interpolate import compute_midpoint_line

    midline = compute_midpoint_line(left_ln_boundary=left, right_ln_boundary=right, num_interp_pts=num_points)[0]
    if midline.shape[1] == 2:  # av2 drops z for single-point edges
        z = np.linspace((left[0, 2] + right[0, 2]) / 2, (left[-1, 2] + right[-1, 2]) / 2, len(midline))
        midline = np.column_stack([midline, z])
    return midline


def map_features(map_json: Path) -> dict[str, Any]:
    """Map polygons (lanes, then crosswalks both ways), their point vectors and graph edges."""
    static_map, centerlines = _read_map(map_json)
    lanes = static_map.get_scenario_lane_segments()
    crosswalks = static_map.get_scenario_ped_crossings()
    num_lanes, num_crosswalks = len(lanes), len(crosswalks)
    num_polygons = num_lanes + 2 * num_crosswalks

    poly_position = np.zeros((num_polygons, 3), dtype=np.float64)
    poly_orientation = np.zeros(num_polygons, dtype=np.float64)
    poly_height = np.zeros(num_polygons, dtype=np.float64)
    poly_type = np.zeros(num_polygons, dtype=np.uint8)
    poly_intersection = np.zeros(num_polygons, dtype=np.uint8)
    lane_points, forward_cw_points, backward_cw_points = _PointBuffer(), _PointBuffer(), _PointBuffer()
    centerline_code = _POINT_TYPE_CODE["CENTERLINE"]
    crosswalk_code = _POINT_TYPE_CODE["CROSSWALK"]

    for index, lane in enumerate(lanes):
        centerline = centerlines.get(lane.id)
        if centerline is None or len(centerline) < 2:
            centerline = static_map.get_lane_segment_centerline(lane.id)
        first_vector = centerline[1] - centerline[0]
        poly_position[index] = centerline[0]
        poly_orientation[index] = math.atan2(first_vector[1], first_vector[0])
        poly_height[index] = first_vector[2]
        poly_type[index] = _POLYGON_TYPE_CODE[lane.lane_type.value]
        poly_intersection[index] = _INTERSECTION_CODE[lane.is_intersection]
        lane_points.add_polygon([
            (*_polyline_vectors(lane.left_lane_boundary.xyz), _POINT_TYPE_CODE[lane.left_mark_type.value], _SIDE_LEFT),
            (*_polyline_vectors(lane.right_lane_boundary.xyz), _POINT_TYPE_CODE[lane.right_mark_type.value], _SIDE_RIGHT),
            (*_polyline_vectors(centerline), centerline_code, _SIDE_CENTER),
        ])

    for index, crosswalk in enumerate(crosswalks):
        forward, backward = num_lanes + index, num_lanes + num_crosswalks + index
        edge1, edge2 = crosswalk.edge1.xyz, crosswalk.edge2.xyz
        start, end = (edge1[0] + edge2[0]) / 2, (edge1[-1] + edge2[-1]) / 2
        direction = end - start
        poly_position[forward], poly_position[backward] = start, end
        poly_orientation[forward] = math.atan2(direction[1], direction[0])
        poly_orientation[backward] = math.atan2(-direction[1], -direction[0])
        poly_height[forward], poly_height[backward] = direction[2], -direction[2]
        poly_type[[forward, backward]] = _POLYGON_TYPE_CODE["PEDESTRIAN"]
        poly_intersection[[forward, backward]] = _INTERSECTION_CODE[None]
        # edge1 is the left boundary when its midpoint lies strictly left of start -> end.
        probe = (edge1[0] + edge1[-1]) / 2 - start
        left, right = (edge1, edge2) if direction[0] * probe[1] - direction[1] * probe[0] > 0 else (edge2, edge1)
        num_midline_points = math.ceil(float(np.linalg.norm(direction)) / 2.0) + 1
        midline = _crosswalk_midline(left, right, num_midline_points)
        forward_cw_points.add_polygon([
            (*_polyline_vectors(left), crosswalk_code, _SIDE_LEFT),
            (*_polyline_vectors(right), crosswalk_code, _SIDE_RIGHT),
            (*_polyline_vectors(midline), centerline_code, _SIDE_CENTER),
        ])
        # Walking the other way: the right edge becomes the left one.
        backward_cw_points.add_polygon([
            (*_polyline_vectors(right[::-1]), crosswalk_code, _SIDE_LEFT),
            (*_polyline_vectors(left[::-1]), crosswalk_code, _SIDE_RIGHT),
            (*_polyline_vectors(midline[::-1]), centerline_code, _SIDE_CENTER),
        ])

    points = _merge_point_buffers([lane_points, forward_cw_points, backward_cw_points])
    counts = np.array(lane_points.counts + forward_cw_points.counts + backward_cw_points.counts, dtype=np.int64)
    point_to_polygon = np.stack([
        np.arange(int(counts.sum()), dtype=np.int64),
        np.repeat(np.arange(num_polygons, dtype=np.int64), counts),
    ])
    edges, edge_types = _polygon_edges(lanes, crosswalks)
    return {
        "map_polygon": {
            "num_nodes": num_polygons,
            "position": poly_position.astype(np.float32),
            "orientation": poly_orientation.astype(np.float32),
            "height": poly_height.astype(np.float32),
            "type": poly_type,
            "is_intersection": poly_intersection,
        },
        "map_point": points,
        "point_to_polygon": point_to_polygon,
        "polygon_to_polygon": edges,
        "polygon_to_polygon_type": edge_types,
    }


def _merge_point_buffers(buffers: list[_PointBuffer]) -> dict[str, Any]:
    merged = _PointBuffer()
    for buffer in buffers:
        merged.starts += buffer.starts
        merged.vectors += buffer.vectors
        merged.types += buffer.types
        merged.sides += buffer.sides
    return merged.arrays()


def _polygon_edges(lanes: list[Any], crosswalks: list[Any]) -> tuple[np.ndarray, np.ndarray]:
    """PRED/SUCC/LEFT/RIGHT edges (neighbour -> lane), per lane in that order, as upstream."""
    polygon_index: dict[int, int] = {}
    for index, polygon_id in enumerate([lane.id for lane in lanes] + [cw.id for cw in crosswalks]):
        polygon_index.setdefault(polygon_id, index)  # first occurrence, like list.index
    sources: list[int] = []
    targets: list[int] = []
    kinds: list[int] = []

    def link(neighbour_ids: list[int], target: int, kind: str) -> None:
        for neighbour in neighbour_ids:
            source = polygon_index.get(neighbour)
            if source is not None:
                sources.append(source)
                targets.append(target)
                kinds.append(_EDGE_CODE[kind])

    for target, lane in enumerate(lanes):
        link(lane.predecessors, target, "PRED")
        link(lane.successors, target, "SUCC")
        link([] if lane.left_neighbor_id is None else [lane.left_neighbor_id], target, "LEFT")
        link([] if lane.right_neighbor_id is None else [lane.right_neighbor_id], target, "RIGHT")
    edges = np.array([sources, targets], dtype=np.int64).reshape(2, -1)
    return edges, np.array(kinds, dtype=np.uint8)
