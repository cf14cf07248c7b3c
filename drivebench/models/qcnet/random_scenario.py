"""Random but plausible RawScenarios (AV2 processed-data semantics) for tests and CPU benchmarks.

Not a dataset: the Argoverse 2 loader and its synthetic generator live in ``drivebench/data``.
This only makes scenes of a chosen size, with roads of parallel lane segments (typed pred/succ/
left/right relations, boundary and centerline vectors) and agents driving along them, so QCNet's
graphs have realistic densities. The default size matches the benchmark scene used for the
upstream comparison (63 agents, 216 polygons, about 1,467 points); at the default ``extent`` an
agent-step sees about 33 polygons within 50 m (the real AV2 fixture scene: 22.5 of its 83).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from drivebench.data.argoverse2 import schema
from drivebench.models.qcnet.vocab import FOCAL_CATEGORY, NUM_FUTURE_STEPS, NUM_HISTORICAL_STEPS, SCORED_CATEGORY

_LANES_PER_ROAD = 3
_SEGMENTS_PER_LANE = 8
_SEGMENT_LENGTH = 25.0
_LANE_WIDTH = 3.5
_REL_PRED, _REL_SUCC, _REL_LEFT, _REL_RIGHT = (
    schema.POLYGON_TO_POLYGON_TYPES.index(n) for n in ("PRED", "SUCC", "LEFT", "RIGHT"))
_POINT_CENTERLINE = schema.POINT_TYPES.index("CENTERLINE")
_POINT_SIDES = tuple(schema.POINT_SIDES.index(n) for n in ("LEFT", "RIGHT", "CENTER"))
_NUM_LANE_MARKS = len(schema.LANE_MARK_TYPES)
_INTERSECTION = schema.POLYGON_IS_INTERSECTION.index(True)
_NOT_INTERSECTION = schema.POLYGON_IS_INTERSECTION.index(False)


def random_scenario(num_agents: int = 63, num_polygons: int = 216, seed: int = 0, extent: float = 200.0,
                    origin: tuple[float, float] = (2150.0, -830.0)) -> dict[str, Any]:
    """A RawScenario dict (see ``drivebench/models/qcnet/batch.py`` for how it is consumed)."""
    if num_agents < 2:
        raise ValueError(f"num_agents={num_agents}: a scene needs at least the AV and a focal agent")
    rng = np.random.default_rng(seed)
    per_road = _LANES_PER_ROAD * _SEGMENTS_PER_LANE
    num_roads = -(-num_polygons // per_road)
    road_angle = rng.uniform(-np.pi, np.pi, num_roads)
    road_anchor = np.asarray(origin) + rng.uniform(-extent / 2, extent / 2, (num_roads, 2))
    road_dir = np.stack([np.cos(road_angle), np.sin(road_angle)], -1)
    road_normal = np.stack([-road_dir[:, 1], road_dir[:, 0]], -1)

    # polygon p = (road, lane, segment), lanes offset along the road normal
    p = np.arange(num_polygons)
    road, lane, seg = p // per_road, (p % per_road) // _SEGMENTS_PER_LANE, p % _SEGMENTS_PER_LANE
    arc0 = (seg - _SEGMENTS_PER_LANE / 2) * _SEGMENT_LENGTH
    lateral = (lane - (_LANES_PER_ROAD - 1) / 2) * _LANE_WIDTH
    start = road_anchor[road] + arc0[:, None] * road_dir[road] + lateral[:, None] * road_normal[road]
    pl_orient = road_angle[road].astype(np.float32)

    map_polygon = {
        "num_nodes": num_polygons,
        "position": np.concatenate([start, np.zeros((num_polygons, 1))], 1).astype(np.float32),
        "orientation": pl_orient,
        "height": np.zeros(num_polygons, np.float32),
        "type": rng.choice(4, num_polygons, p=[0.8, 0.08, 0.04, 0.08]).astype(np.uint8),
        "is_intersection": np.where(rng.random(num_polygons) < 0.15, _INTERSECTION, _NOT_INTERSECTION).astype(np.uint8),
    }
    map_point, point_to_polygon = _boundary_points(rng, start, road_dir[road], road_normal[road], pl_orient)

    src, dst, rel = [], [], []
    same_road_next = (seg < _SEGMENTS_PER_LANE - 1) & (p + 1 < num_polygons)
    src += [p[same_road_next], p[same_road_next] + 1]  # pred of the next segment, succ of this one
    dst += [p[same_road_next] + 1, p[same_road_next]]
    rel += [np.full(same_road_next.sum(), _REL_PRED), np.full(same_road_next.sum(), _REL_SUCC)]
    has_left = (lane < _LANES_PER_ROAD - 1) & (p + _SEGMENTS_PER_LANE < num_polygons)
    src += [p[has_left] + _SEGMENTS_PER_LANE, p[has_left]]
    dst += [p[has_left], p[has_left] + _SEGMENTS_PER_LANE]
    rel += [np.full(has_left.sum(), _REL_LEFT), np.full(has_left.sum(), _REL_RIGHT)]

    agent = _agents(rng, num_agents, road_anchor, road_dir, road_normal)
    return {
        "scenario_id": f"random-{seed:08d}",
        "city": "random",
        "agent": agent,
        "map_polygon": map_polygon,
        "map_point": map_point,
        "point_to_polygon": point_to_polygon,
        "polygon_to_polygon": np.stack([np.concatenate(src), np.concatenate(dst)]).astype(np.int64),
        "polygon_to_polygon_type": np.concatenate(rel).astype(np.uint8),
    }


def _boundary_points(rng: np.random.Generator, start: np.ndarray, direction: np.ndarray, normal: np.ndarray,
                     orient: np.ndarray) -> tuple[dict[str, Any], np.ndarray]:
    """Left, right and centre vectors of each lane segment, 1-3 per side (about 6.8 points per polygon)."""
    num_polygons = start.shape[0]
    pieces = rng.choice([1, 2, 3], num_polygons, p=[0.25, 0.25, 0.5])
    polygon = np.repeat(np.arange(num_polygons), 3 * pieces)
    side = np.concatenate([np.repeat(_POINT_SIDES, k) for k in pieces])
    piece = np.concatenate([np.tile(np.arange(k), 3) for k in pieces])
    num_pieces = pieces[polygon]
    offset = np.select([side == 0, side == 1], [_LANE_WIDTH / 2, -_LANE_WIDTH / 2], 0.0)
    length = _SEGMENT_LENGTH / num_pieces
    pos = start[polygon] + (piece * length)[:, None] * direction[polygon] + offset[:, None] * normal[polygon]
    mark = rng.choice(_NUM_LANE_MARKS, num_polygons)
    num_points = polygon.size
    points = {
        "num_nodes": num_points,
        "position": np.concatenate([pos, np.zeros((num_points, 1))], 1).astype(np.float32),
        "orientation": orient[polygon].astype(np.float32),
        "magnitude": length.astype(np.float32),
        "height": np.zeros(num_points, np.float32),
        "type": np.where(side == _POINT_SIDES[2], _POINT_CENTERLINE, mark[polygon]).astype(np.uint8),
        "side": side.astype(np.uint8),
    }
    return points, np.stack([np.arange(num_points), polygon]).astype(np.int64)


def _agents(rng: np.random.Generator, num_agents: int, road_anchor: np.ndarray, road_dir: np.ndarray,
            road_normal: np.ndarray) -> dict[str, Any]:
    steps = NUM_HISTORICAL_STEPS + NUM_FUTURE_STEPS
    t = np.arange(steps) * 0.1
    road = rng.integers(0, road_anchor.shape[0], num_agents)
    kind = rng.choice(4, num_agents, p=[0.7, 0.15, 0.1, 0.05])  # vehicle, pedestrian, cyclist, static
    kind[:2] = 0  # the AV and the focal agent drive
    speed = np.select([kind == 0, kind == 1, kind == 2], [rng.uniform(2, 15, num_agents),
                                                         rng.uniform(0.5, 2, num_agents),
                                                         rng.uniform(3, 7, num_agents)], 0.0)
    accel = rng.normal(0, 0.4, num_agents) * (kind != 3)
    backwards = rng.random(num_agents) < 0.5
    direction = road_dir[road] * np.where(backwards, -1, 1)[:, None]
    arc_speed = np.maximum(speed[:, None] + accel[:, None] * t, 0.0)  # never reverses
    travelled = np.concatenate([np.zeros((num_agents, 1)), np.cumsum(arc_speed[:, :-1] * 0.1, axis=1)], axis=1)
    arc = rng.uniform(-80, 40, num_agents)[:, None] + travelled
    lateral = rng.integers(-1, 2, num_agents)[:, None] * _LANE_WIDTH + 0.3 * np.sin(
        rng.uniform(0.1, 0.5, num_agents)[:, None] * t + rng.uniform(0, 6, num_agents)[:, None])
    pos2 = (road_anchor[road][:, None] + arc[..., None] * direction[:, None]
            + lateral[..., None] * road_normal[road][:, None] + rng.normal(0, 0.02, (num_agents, steps, 2)))
    velocity2 = arc_speed[..., None] * direction[:, None]
    heading = np.broadcast_to(np.arctan2(direction[:, 1], direction[:, 0])[:, None], (num_agents, steps)).copy()
    heading += rng.normal(0, 0.01, heading.shape)

    observed = np.ones((num_agents, steps), dtype=bool)
    first = np.where(rng.random(num_agents) < 0.2, rng.integers(0, 45, num_agents), 0)
    last = np.where(rng.random(num_agents) < 0.15, rng.integers(50, steps, num_agents), steps)
    first[:2], last[:2] = 0, steps
    observed &= (np.arange(steps) >= first[:, None]) & (np.arange(steps) < last[:, None])

    position = np.zeros((num_agents, steps, 3), np.float32)
    position[..., :2] = pos2
    velocity = np.zeros((num_agents, steps, 3), np.float32)
    velocity[..., :2] = velocity2
    position[~observed], velocity[~observed], heading[~observed] = 0.0, 0.0, 0.0

    valid, predict = upstream_masks(observed)
    category = np.ones(num_agents, np.uint8)
    category[1] = FOCAL_CATEGORY
    category[2:5] = SCORED_CATEGORY
    agent_type = np.array([schema.AGENT_TYPES.index(n) for n in ("vehicle", "pedestrian", "cyclist", "static")],
                          np.uint8)[kind]
    return {
        "num_nodes": num_agents,
        "av_index": 0,
        "id": ["AV"] + [str(i) for i in range(1, num_agents)],
        "type": agent_type,
        "category": category,
        "valid_mask": valid,
        "predict_mask": predict,
        "position": position,
        "heading": heading.astype(np.float32),
        "velocity": velocity,
    }


def upstream_masks(observed: np.ndarray,
                   num_historical_steps: int = NUM_HISTORICAL_STEPS) -> tuple[np.ndarray, np.ndarray]:
    """Upstream's ``valid_mask`` / ``predict_mask`` from per-step observation flags (A, 110).

    History step t is valid only if t-1 and t were observed (step 0 never is); future steps are
    predicted where observed, and only for agents observed at the current step.
    """
    h = num_historical_steps
    valid = observed.copy()
    valid[:, 1:h] = observed[:, : h - 1] & observed[:, 1:h]
    valid[:, 0] = False
    predict = observed.copy()
    predict[:, :h] = False
    predict[~observed[:, h - 1], h:] = False
    return valid, predict


def random_batch(transform: Any, num_scenes: int = 4, seed: int = 0, **scene_kwargs: Any) -> dict[str, Any]:
    """``collate_qcnet`` of ``num_scenes`` random scenarios passed through ``transform`` (a QCNetTransform)."""
    from drivebench.models.qcnet.batch import collate_qcnet

    return collate_qcnet([transform(random_scenario(seed=seed + i, **scene_kwargs)) for i in range(num_scenes)])
