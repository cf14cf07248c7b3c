"""Vocabularies and shapes shared by the Argoverse 2 loader, the generator and the QCNet model.

The category lists follow upstream QCNet (`datasets/argoverse_v2_dataset.py`, ZikangZhou/QCNet
@55cacb4) entry for entry, so that integer codes mean the same thing here as in upstream
checkpoints and papers. Type and category codes are indices into these tuples.

RawScenario
-----------
What ``scenario.load_scenario_dir`` returns and the preprocessing cache stores: one scenario as a
plain dict of numpy arrays (picklable, no torch), with the semantics of upstream QCNet's
``process()`` (A agents, P map polygons, M map points, E polygon->polygon edges)::

    {"scenario_id": str, "city": str,
     "agent": {
        "num_nodes": A,              # tracks with at least one row in the first 50 steps
        "av_index": int,             # index of track "AV"
        "id": list[str],             # track ids, in order of first appearance in the history
        "type": uint8 (A,),          # AGENT_TYPES index
        "category": uint8 (A,),      # AGENT_CATEGORIES index (0 fragment .. 3 focal)
        "valid_mask": bool (A,110),  # history step t valid only if rows exist at t and t-1
                                     # (step 0 never valid); future steps: a row exists
        "predict_mask": bool (A,110),# future steps with a row, for agents present at step 49;
                                     # test split (no future rows): all future steps of agents
                                     # present at step 49 or scored/focal
        "position": float32 (A,110,3),   # city frame metres, z = 0
        "heading": float32 (A,110),      # radians
        "velocity": float32 (A,110,3)},  # m/s, z = 0
     "map_polygon": {
        "num_nodes": P,              # lane segments, then crosswalks, then crosswalks reversed
        "position": float32 (P,3),   # first centerline point (crosswalk: start of its midline)
        "orientation": float32 (P,), # direction of the first centerline vector
        "height": float32 (P,),      # z rise of the first centerline vector
        "type": uint8 (P,),          # POLYGON_TYPES index
        "is_intersection": uint8 (P,)},  # POLYGON_IS_INTERSECTION index: 0 True, 1 False, 2 unknown
     "map_point": {
        "num_nodes": M,              # per polygon: left, right, centre polyline vectors
        "position": float32 (M,3),   # vector start point
        "orientation": float32 (M,), # vector direction
        "magnitude": float32 (M,),   # vector length in xy
        "height": float32 (M,),      # vector z rise
        "type": uint8 (M,),          # POINT_TYPES index
        "side": uint8 (M,)},         # POINT_SIDES index
     "point_to_polygon": int64 (2, M),        # [point index, polygon index]
     "polygon_to_polygon": int64 (2, E),      # [source polygon, target polygon]
     "polygon_to_polygon_type": uint8 (E,)}   # POLYGON_TO_POLYGON_TYPES index

Missing values (steps without a row) are zeros; masks say which entries are real.
"""

from __future__ import annotations

NUM_HISTORICAL_STEPS = 50
NUM_FUTURE_STEPS = 60
NUM_STEPS = NUM_HISTORICAL_STEPS + NUM_FUTURE_STEPS
STEP_SECONDS = 0.1  # 10 Hz

AGENT_TYPES = (
    "vehicle",
    "pedestrian",
    "motorcyclist",
    "cyclist",
    "bus",
    "static",
    "background",
    "construction",
    "riderless_bicycle",
    "unknown",
)
# object_category values in the parquet; the names are av2's TrackCategory names.
AGENT_CATEGORIES = ("fragment", "unscored", "scored", "focal")

POLYGON_TYPES = ("VEHICLE", "BIKE", "BUS", "PEDESTRIAN")
# Upstream's order (True, False, None): code 0 is an intersection, 1 is not, 2 unknown (crosswalks).
POLYGON_IS_INTERSECTION = (True, False, None)

# Lane mark types in av2's LaneMarkType order, then the two kinds of point that are not marks.
POINT_TYPES = (
    "DASH_SOLID_YELLOW",
    "DASH_SOLID_WHITE",
    "DASHED_WHITE",
    "DASHED_YELLOW",
    "DOUBLE_SOLID_YELLOW",
    "DOUBLE_SOLID_WHITE",
    "DOUBLE_DASH_YELLOW",
    "DOUBLE_DASH_WHITE",
    "SOLID_YELLOW",
    "SOLID_WHITE",
    "SOLID_DASH_WHITE",
    "SOLID_DASH_YELLOW",
    "SOLID_BLUE",
    "NONE",
    "UNKNOWN",
    "CROSSWALK",
    "CENTERLINE",
)
LANE_MARK_TYPES = POINT_TYPES[:15]
POINT_SIDES = ("LEFT", "RIGHT", "CENTER")
POLYGON_TO_POLYGON_TYPES = ("NONE", "PRED", "SUCC", "LEFT", "RIGHT")

CITIES = ("austin", "dearborn", "miami", "palo-alto", "pittsburgh", "washington-dc")

# Scenario parquet columns in file order, with their Arrow types (map_id and slice_id optional).
PARQUET_COLUMNS = (
    ("observed", "bool"),
    ("track_id", "string"),
    ("object_type", "string"),
    ("object_category", "int64"),
    ("timestep", "int64"),
    ("position_x", "double"),
    ("position_y", "double"),
    ("heading", "double"),
    ("velocity_x", "double"),
    ("velocity_y", "double"),
    ("scenario_id", "string"),
    ("start_timestamp", "double"),
    ("end_timestamp", "double"),
    ("num_timestamps", "int64"),
    ("focal_track_id", "string"),
    ("city", "string"),
    ("map_id", "uint64"),
    ("slice_id", "string"),
)
OPTIONAL_PARQUET_COLUMNS = ("map_id", "slice_id")
AV_TRACK_ID = "AV"

LAYOUT_HINT = "<root>/<split>/<id>/scenario_<id>.parquet and <root>/<split>/<id>/log_map_archive_<id>.json"


def scenario_parquet_name(scenario_id: str) -> str:
    return f"scenario_{scenario_id}.parquet"


def map_json_name(scenario_id: str) -> str:
    return f"log_map_archive_{scenario_id}.json"
