"""Vectorised numpy builders for QCNet's graphs, run per scene on the CPU (DataLoader workers).

Upstream QCNet builds these inside ``forward`` on the GPU with torch_cluster ``radius`` /
``radius_graph`` and PyG ``dense_to_sparse`` / ``subgraph``; each of those costs a host sync. Here
every graph is a dense boolean adjacency over the scene (scenes are small: tens of agents,
hundreds of polygons) turned into an edge list with ``np.nonzero``. Radius tests are strict
(``distance < radius``) like torch_cluster's. Every builder returns ``(2, E)`` int64 ``[src; dst]``
with edges sorted by destination.
"""

from __future__ import annotations

import numpy as np


def _sq_dist(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Squared 2D distances between every row of ``a`` (..., 2) and ``b`` (M, 2) -> (..., M)."""
    dx = a[..., 0, None] - b[:, 0]
    dy = a[..., 1, None] - b[:, 1]
    return dx * dx + dy * dy


def temporal_edges(valid: np.ndarray, time_span: int) -> np.ndarray:
    """Edges between the valid steps of one agent: ``t_src -> t_dst`` for ``0 < t_dst - t_src <= span``.

    ``valid``: (A, T) bool. Nodes are agent-steps, numbered ``a * T + t``.
    """
    num_agents, num_steps = valid.shape
    span = min(time_span, num_steps - 1)
    if span <= 0 or num_agents == 0:
        return np.zeros((2, 0), dtype=np.int64)
    t_dst = np.arange(num_steps)[:, None]
    t_src = t_dst - np.arange(1, span + 1)[None, :]  # (T, span)
    in_range = t_src >= 0
    src_valid = valid[:, np.clip(t_src, 0, None)]  # (A, T, span)
    adj = src_valid & valid[:, :, None] & in_range[None]
    a, t, d = np.nonzero(adj)
    dst = a * num_steps + t
    src = dst - (d + 1)
    return np.stack([src, dst]).astype(np.int64)


def polygon_to_agent_step_edges(pos_agent: np.ndarray, valid: np.ndarray, pos_polygon: np.ndarray,
                                radius: float) -> np.ndarray:
    """``polygon -> agent-step`` for every valid agent-step within ``radius`` of the polygon.

    ``pos_agent`` (A, T, 2), ``valid`` (A, T), ``pos_polygon`` (P, 2). Destinations are ``a * T + t``.
    """
    num_agents, num_steps = valid.shape
    adj = (_sq_dist(pos_agent, pos_polygon) < radius * radius) & valid[:, :, None]  # (A, T, P)
    a, t, p = np.nonzero(adj)
    return np.stack([p, a * num_steps + t]).astype(np.int64)


def agent_to_agent_step_edges(pos_agent: np.ndarray, valid: np.ndarray, radius: float) -> np.ndarray:
    """``(a_src, t) -> (a_dst, t)`` between distinct agents valid at step ``t`` and within ``radius``."""
    num_agents, num_steps = valid.shape
    pos_t = pos_agent.transpose(1, 0, 2)  # (T, A, 2)
    dx = pos_t[:, :, None, 0] - pos_t[:, None, :, 0]
    dy = pos_t[:, :, None, 1] - pos_t[:, None, :, 1]
    adj = (dx * dx + dy * dy) < radius * radius  # (T, A_dst, A_src)
    valid_t = valid.T  # (T, A)
    adj &= valid_t[:, :, None] & valid_t[:, None, :]
    adj &= ~np.eye(num_agents, dtype=bool)[None]
    a_dst, t, a_src = np.nonzero(adj.transpose(1, 0, 2))  # ordered by destination agent, then step
    return np.stack([a_src * num_steps + t, a_dst * num_steps + t]).astype(np.int64)


def polygon_to_polygon_edges(pos_polygon: np.ndarray, radius: float, relation_index: np.ndarray,
                             relation_type: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Radius graph over polygons (no self loops, type 0) merged with the typed lane relations.

    Where a relation duplicates a radius edge (or another relation), the larger type wins, like
    upstream's ``coalesce(..., reduce='max')``. Returns ``(edge_index, edge_type)``.
    """
    num_polygons = pos_polygon.shape[0]
    types = np.full((num_polygons, num_polygons), -1, dtype=np.int16)  # [dst, src]
    near = _sq_dist(pos_polygon, pos_polygon) < radius * radius
    np.fill_diagonal(near, False)
    types[near] = 0
    if relation_index.size:
        np.maximum.at(types, (relation_index[1], relation_index[0]), relation_type.astype(np.int16))
    dst, src = np.nonzero(types >= 0)
    return np.stack([src, dst]).astype(np.int64), types[dst, src].astype(np.int64)


def history_to_agent_edges(mask_src: np.ndarray, mask_dst: np.ndarray) -> np.ndarray:
    """``agent-step (a, t) -> agent a`` for the decoder's t2m attention (before mode expansion)."""
    num_steps = mask_src.shape[1]
    a, t = np.nonzero(mask_src & mask_dst[:, None])
    return np.stack([a * num_steps + t, a]).astype(np.int64)


def polygon_to_agent_edges(pos_agent: np.ndarray, mask_dst: np.ndarray, pos_polygon: np.ndarray,
                           radius: float) -> np.ndarray:
    """``polygon -> agent`` within ``radius`` of the agent's current position, for agents to predict."""
    adj = (_sq_dist(pos_agent, pos_polygon) < radius * radius) & mask_dst[:, None]  # (A, P)
    a, p = np.nonzero(adj)
    return np.stack([p, a]).astype(np.int64)


def agent_to_agent_edges(pos_agent: np.ndarray, mask_src: np.ndarray, mask_dst: np.ndarray,
                         radius: float) -> np.ndarray:
    """``agent -> agent`` (current positions, no self loops) from valid sources to agents to predict."""
    adj = _sq_dist(pos_agent, pos_agent) < radius * radius  # (A_dst, A_src)
    np.fill_diagonal(adj, False)
    adj &= mask_dst[:, None] & mask_src[None, :]
    a_dst, a_src = np.nonzero(adj)
    return np.stack([a_src, a_dst]).astype(np.int64)


def mode_to_mode_edges(mask_dst: np.ndarray, num_modes: int) -> np.ndarray:
    """All ``K x K`` pairs (self loops included) among the mode queries ``a * K + k`` of each agent to predict."""
    agents = np.nonzero(mask_dst)[0]
    k = np.arange(num_modes)
    dst = (agents[:, None, None] * num_modes + k[None, :, None]).repeat(num_modes, axis=2)
    src = (agents[:, None, None] * num_modes + k[None, None, :]).repeat(num_modes, axis=1)
    return np.stack([src.reshape(-1), dst.reshape(-1)]).astype(np.int64)
