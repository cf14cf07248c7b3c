"""QCNet's CPU batch builder: per-scene targets and graphs (``QCNetTransform``) and ``collate_qcnet``.

Why: upstream QCNet builds its radius graphs inside ``forward`` on the GPU, which costs a host sync
per graph and dozens of small kernels; the step is launch-bound. Here every graph is built per
scene in the DataLoader workers (numpy, vectorised, see ``graphs.py``), so ``forward`` is a fixed
sequence of gathers, matmuls and segment reductions with no data-dependent host work.

Input: a RawScenario (the dict of numpy arrays documented in ``drivebench/data/argoverse2``; the
semantics of upstream QCNet's processed AV2 pickles, 110 steps = 50 history + 60 future).

Batch keys (``collate_qcnet`` output). ``A``/``P``/``M``: agents, polygons, points summed over the
``B`` scenes; ``T`` = num_historical_steps (50), ``F`` = num_future_steps (60), ``K`` = num_modes.
Positions are in the scene's global frame and keep only x, y (QCNet's AV2 ``input_dim`` is 2).

Scene-level (not tensors, or CPU-only bookkeeping; ``forward`` never reads them):
  ``num_graphs``          int, B
  ``scenario_id``, ``city``  list[str] (B)
  ``agent_counts``, ``polygon_counts``, ``point_counts``  list[int] (B): nodes per scene
  ``av_index``            long (B,): the AV's agent index in the batch (offsets added)

Agents (A rows, agent-major, scene after scene):
  ``agent_position``      float32 (A, T, 2)  history positions
  ``agent_heading``       float32 (A, T)     history headings (rad)
  ``agent_velocity``      float32 (A, T, 2)  history velocities (m/s)
  ``agent_valid_mask``    bool    (A, T)     upstream's history mask (step t valid iff t-1 and t observed)
  ``agent_type``          long    (A,)       0..9
  ``agent_category``      long    (A,)       AV2 track category (3 = focal, 2 = scored)
  ``agent_predict_mask``  bool    (A, F)     future steps that carry loss (upstream ``predict_mask[:, T:]``)
  ``agent_target``        float32 (A, F, 4)  future (x, y, z, heading) in the agent frame at step T-1
  ``agent_batch``         long    (A,)       scene index of each agent

Map polygons (P rows) and points (M rows):
  ``polygon_position`` float32 (P, 2), ``polygon_orientation`` float32 (P,),
  ``polygon_type`` long (P,), ``polygon_is_intersection`` long (P,), ``polygon_batch`` long (P,)
  ``point_position`` float32 (M, 2), ``point_orientation`` float32 (M,), ``point_magnitude`` float32 (M,),
  ``point_type`` long (M,), ``point_side`` long (M,), ``point_batch`` long (M,)

Edges, all long (2, E) as ``[src; dst]`` in batch-global node numbers, sorted by dst within a scene.
Node spaces: agent ``a``; agent-step ``a * T + t``; mode query ``a * K + k``; polygon; point.
  ``edge_pt2pl``   point -> polygon (membership)
  ``edge_pl2pl``   polygon -> polygon: radius ``pl2pl_radius`` (no loops) merged with lane relations;
                   ``edge_pl2pl_type`` long (E,): 0 radius only, 1 pred, 2 succ, 3 left, 4 right (max on merge)
  ``edge_t``       agent-step -> later agent-step of the same agent, at most ``time_span`` steps apart, both valid
  ``edge_pl2a``    polygon -> agent-step, distance < ``pl2a_radius``, agent-step valid
  ``edge_a2a``     agent-step -> agent-step at the same step, distinct agents, both valid, distance < ``a2a_radius``
  ``edge_t2m``     agent-step (last ``num_t2m_steps`` valid steps) -> agent, for agents with any predict step
  ``edge_pl2m``    polygon -> agent (current positions, < ``pl2m_radius``), agents to predict
  ``edge_a2m``     agent -> agent (current positions, < ``a2m_radius``, no loops), source valid now, dst to predict
  ``edge_m2m``     mode query -> mode query of the same agent (all K x K, loops included), agents to predict
The K mode queries of an agent share its ``edge_t2m``/``edge_pl2m``/``edge_a2m`` edges (the decoder
attends with ``group_size=K``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from drivebench.models.qcnet import graphs
from drivebench.models.qcnet.geometry import wrap_angle_np
from drivebench.models.qcnet.vocab import NUM_FUTURE_STEPS, NUM_HISTORICAL_STEPS

# Which node space each edge list's source and destination index.
EDGE_NODE_SPACES: dict[str, tuple[str, str]] = {
    "edge_pt2pl": ("point", "polygon"),
    "edge_pl2pl": ("polygon", "polygon"),
    "edge_t": ("agent_step", "agent_step"),
    "edge_pl2a": ("polygon", "agent_step"),
    "edge_a2a": ("agent_step", "agent_step"),
    "edge_t2m": ("agent_step", "agent"),
    "edge_pl2m": ("polygon", "agent"),
    "edge_a2m": ("agent", "agent"),
    "edge_m2m": ("mode", "mode"),
}
# Per-node arrays concatenated along dim 0, grouped by the count that sizes them.
NODE_KEYS: dict[str, tuple[str, ...]] = {
    "agent": ("agent_position", "agent_heading", "agent_velocity", "agent_valid_mask", "agent_type",
              "agent_category", "agent_predict_mask", "agent_target"),
    "polygon": ("polygon_position", "polygon_orientation", "polygon_type", "polygon_is_intersection"),
    "point": ("point_position", "point_orientation", "point_magnitude", "point_type", "point_side"),
}
EDGE_ATTR_KEYS: dict[str, str] = {"edge_pl2pl_type": "edge_pl2pl"}


@dataclass(frozen=True)
class GraphSettings:
    """Everything the CPU graphs depend on; the net exposes the same values as ``transform_kwargs``."""

    num_historical_steps: int = NUM_HISTORICAL_STEPS
    num_future_steps: int = NUM_FUTURE_STEPS
    num_modes: int = 6
    time_span: int = 10
    pl2pl_radius: float = 150.0
    pl2a_radius: float = 50.0
    a2a_radius: float = 50.0
    num_t2m_steps: int = 30
    pl2m_radius: float = 150.0
    a2m_radius: float = 150.0


class QCNetTransform:
    """RawScenario -> per-scene arrays and local edge lists (numpy); see the module docstring."""

    def __init__(self, **settings: Any) -> None:
        self.settings = GraphSettings(**settings)

    def __repr__(self) -> str:
        return f"QCNetTransform({asdict(self.settings)})"

    def __call__(self, scenario: Mapping[str, Any]) -> dict[str, Any]:
        s = self.settings
        agent, polygon, point = scenario["agent"], scenario["map_polygon"], scenario["map_point"]
        steps = s.num_historical_steps
        position = np.asarray(agent["position"], dtype=np.float32)
        if position.ndim != 3 or position.shape[1] != steps + s.num_future_steps:
            raise ValueError(
                f"agent.position has shape {position.shape}; QCNetTransform expects (A, "
                f"{steps + s.num_future_steps}, 2|3) for {steps} history + {s.num_future_steps} future steps"
            )
        heading = np.asarray(agent["heading"], dtype=np.float32)
        valid = np.asarray(agent["valid_mask"], dtype=bool)
        predict = np.asarray(agent["predict_mask"], dtype=bool)
        num_agents = position.shape[0]

        hist_pos = np.ascontiguousarray(position[:, :steps, :2])
        hist_valid = np.ascontiguousarray(valid[:, :steps])
        pos_pl = np.ascontiguousarray(np.asarray(polygon["position"], dtype=np.float32)[:, :2])
        pos_now = hist_pos[:, -1]
        mask_dst = predict.any(axis=1)
        mask_t2m = hist_valid.copy()
        mask_t2m[:, : steps - s.num_t2m_steps] = False

        pl2pl, pl2pl_type = graphs.polygon_to_polygon_edges(
            pos_pl, s.pl2pl_radius, np.asarray(scenario["polygon_to_polygon"], dtype=np.int64).reshape(2, -1),
            np.asarray(scenario["polygon_to_polygon_type"]).reshape(-1),
        )
        out: dict[str, Any] = {
            "scenario_id": str(scenario["scenario_id"]),
            "city": str(scenario.get("city", "")),
            "av_index": int(agent["av_index"]),
            "agent_position": hist_pos,
            "agent_heading": np.ascontiguousarray(heading[:, :steps]),
            "agent_velocity": np.ascontiguousarray(np.asarray(agent["velocity"], dtype=np.float32)[:, :steps, :2]),
            "agent_valid_mask": hist_valid,
            "agent_type": np.asarray(agent["type"], dtype=np.int64),
            "agent_category": np.asarray(agent["category"], dtype=np.int64),
            "agent_predict_mask": np.ascontiguousarray(predict[:, steps:]),
            "agent_target": agent_frame_targets(position, heading, steps),
            "polygon_position": pos_pl,
            "polygon_orientation": np.asarray(polygon["orientation"], dtype=np.float32),
            "polygon_type": np.asarray(polygon["type"], dtype=np.int64),
            "polygon_is_intersection": np.asarray(polygon["is_intersection"], dtype=np.int64),
            "point_position": np.ascontiguousarray(np.asarray(point["position"], dtype=np.float32)[:, :2]),
            "point_orientation": np.asarray(point["orientation"], dtype=np.float32),
            "point_magnitude": np.asarray(point["magnitude"], dtype=np.float32),
            "point_type": np.asarray(point["type"], dtype=np.int64),
            "point_side": np.asarray(point["side"], dtype=np.int64),
            "edge_pt2pl": np.asarray(scenario["point_to_polygon"], dtype=np.int64).reshape(2, -1),
            "edge_pl2pl": pl2pl,
            "edge_pl2pl_type": pl2pl_type,
            "edge_t": graphs.temporal_edges(hist_valid, s.time_span),
            "edge_pl2a": graphs.polygon_to_agent_step_edges(hist_pos, hist_valid, pos_pl, s.pl2a_radius),
            "edge_a2a": graphs.agent_to_agent_step_edges(hist_pos, hist_valid, s.a2a_radius),
            "edge_t2m": graphs.history_to_agent_edges(mask_t2m, mask_dst),
            "edge_pl2m": graphs.polygon_to_agent_edges(pos_now, mask_dst, pos_pl, s.pl2m_radius),
            "edge_a2m": graphs.agent_to_agent_edges(pos_now, mask_t2m[:, -1], mask_dst, s.a2m_radius),
            "edge_m2m": graphs.mode_to_mode_edges(mask_dst, s.num_modes),
        }
        out["_sizes"] = {
            "agent": num_agents,
            "agent_step": num_agents * steps,
            "mode": num_agents * s.num_modes,
            "polygon": int(pos_pl.shape[0]),
            "point": int(out["point_position"].shape[0]),
        }
        return out


def agent_frame_targets(position: np.ndarray, heading: np.ndarray, num_historical_steps: int) -> np.ndarray:
    """Future (x, y, z, heading) of each agent in its own frame at the last history step (upstream TargetBuilder)."""
    now = num_historical_steps - 1
    origin = position[:, now]
    theta = heading[:, now]
    cos, sin = np.cos(theta)[:, None], np.sin(theta)[:, None]
    rel = position[:, now + 1:, :2] - origin[:, None, :2]
    target = np.zeros((position.shape[0], position.shape[1] - now - 1, 4), dtype=np.float32)
    target[..., 0] = rel[..., 0] * cos + rel[..., 1] * sin
    target[..., 1] = -rel[..., 0] * sin + rel[..., 1] * cos
    if position.shape[2] == 3:
        target[..., 2] = position[:, now + 1:, 2] - origin[:, None, 2]
    target[..., 3] = wrap_angle_np(heading[:, now + 1:] - theta[:, None])
    return target


def collate_qcnet(samples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Concatenate ``QCNetTransform`` outputs into one batch (node offsets added to every edge list)."""
    if not samples:
        raise ValueError("collate_qcnet got an empty list of samples")
    spaces = samples[0]["_sizes"].keys()
    counts = {space: np.array([smp["_sizes"][space] for smp in samples], dtype=np.int64) for space in spaces}
    offsets = {space: np.concatenate([[0], np.cumsum(c)[:-1]]) for space, c in counts.items()}

    batch: dict[str, Any] = {
        "num_graphs": len(samples),
        "scenario_id": [smp["scenario_id"] for smp in samples],
        "city": [smp["city"] for smp in samples],
        "agent_counts": counts["agent"].tolist(),
        "polygon_counts": counts["polygon"].tolist(),
        "point_counts": counts["point"].tolist(),
        "av_index": torch.from_numpy(np.array([smp["av_index"] for smp in samples], dtype=np.int64) + offsets["agent"]),
    }
    for space, keys in NODE_KEYS.items():
        for key in keys:
            batch[key] = torch.from_numpy(np.concatenate([smp[key] for smp in samples], axis=0))
        batch[f"{space}_batch"] = torch.from_numpy(np.repeat(np.arange(len(samples)), counts[space]))
    for key, (src_space, dst_space) in EDGE_NODE_SPACES.items():
        shift = np.stack([offsets[src_space], offsets[dst_space]], axis=1)[:, :, None]  # (B, 2, 1)
        batch[key] = torch.from_numpy(np.concatenate([smp[key] + shift[i] for i, smp in enumerate(samples)], axis=1))
    for key in EDGE_ATTR_KEYS:
        batch[key] = torch.from_numpy(np.concatenate([smp[key] for smp in samples], axis=0))
    return batch
