"""QCNet's CPU batch builder: every graph equals a brute-force O(n^2) reference, offsets and targets are right."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from drivebench.models.qcnet import collate_qcnet, make_transform
from drivebench.models.qcnet.batch import EDGE_NODE_SPACES, QCNetTransform, agent_frame_targets
from drivebench.models.qcnet.random_scenario import random_scenario

FIXTURE = Path(__file__).parent / "fixtures" / "av2-real" / "split"


def _edges(array: np.ndarray) -> set[tuple[int, int]]:
    return set(map(tuple, np.asarray(array).T.tolist()))


def _reference_graphs(scenario: dict, s) -> dict[str, set]:
    """Upstream's graph definitions, written as plain loops over every candidate pair."""
    T, K = s.num_historical_steps, s.num_modes
    agent = scenario["agent"]
    pos = agent["position"][:, :T, :2].astype(np.float64)
    valid = agent["valid_mask"][:, :T]
    mask_dst = agent["predict_mask"].any(1)
    pos_pl = scenario["map_polygon"]["position"][:, :2].astype(np.float64)
    A, P = pos.shape[0], pos_pl.shape[0]

    def near(a, b, r):
        return math.hypot(*(a - b)) < r

    ref = {k: set() for k in EDGE_NODE_SPACES}
    ref["edge_pt2pl"] = _edges(scenario["point_to_polygon"])
    for a in range(A):
        for t1 in range(T):
            for t2 in range(T):
                if valid[a, t1] and valid[a, t2] and 0 < t2 - t1 <= s.time_span:
                    ref["edge_t"].add((a * T + t1, a * T + t2))
            for p in range(P):
                if valid[a, t1] and near(pos_pl[p], pos[a, t1], s.pl2a_radius):
                    ref["edge_pl2a"].add((p, a * T + t1))
            for b in range(A):
                if a != b and valid[a, t1] and valid[b, t1] and near(pos[a, t1], pos[b, t1], s.a2a_radius):
                    ref["edge_a2a"].add((a * T + t1, b * T + t1))
    pl2pl = {}
    for i in range(P):
        for j in range(P):
            if i != j and near(pos_pl[i], pos_pl[j], s.pl2pl_radius):
                pl2pl[(i, j)] = 0
    for (i, j), typ in zip(scenario["polygon_to_polygon"].T.tolist(), scenario["polygon_to_polygon_type"].tolist()):
        pl2pl[(i, j)] = max(pl2pl.get((i, j), -1), typ)
    ref["edge_pl2pl"] = set(pl2pl)
    now = T - 1
    for a in range(A):
        if not mask_dst[a]:
            continue
        for t in range(T - s.num_t2m_steps, T):
            if valid[a, t]:
                ref["edge_t2m"].add((a * T + t, a))
        for p in range(P):
            if near(pos_pl[p], pos[a, now], s.pl2m_radius):
                ref["edge_pl2m"].add((p, a))
        for b in range(A):
            if b != a and valid[b, now] and near(pos[b, now], pos[a, now], s.a2m_radius):
                ref["edge_a2m"].add((b, a))
        for k1 in range(K):
            for k2 in range(K):
                ref["edge_m2m"].add((a * K + k1, a * K + k2))
    return ref, pl2pl


@pytest.mark.parametrize("seed", [0, 1])
def test_every_graph_matches_brute_force_reference(seed):
    # small radii relative to the scene so that every radius actually cuts
    transform = make_transform("test", pl2pl_radius=40.0, pl2a_radius=20.0, a2a_radius=25.0, pl2m_radius=30.0,
                               a2m_radius=30.0)
    scenario = random_scenario(num_agents=7, num_polygons=30, seed=seed, extent=60.0)
    out = transform(scenario)
    ref, pl2pl_types = _reference_graphs(scenario, transform.settings)
    for key in EDGE_NODE_SPACES:
        got = _edges(out[key])
        assert len(got) == out[key].shape[1], f"{key} has duplicate edges"
        assert got == ref[key], f"{key}: {len(got ^ ref[key])} edges differ from the reference"
        assert 0 < len(got) < 10**6
        if key != "edge_pt2pl":  # builders sort by destination
            assert np.all(np.diff(out[key][1]) >= 0), key
    got_types = dict(zip(map(tuple, out["edge_pl2pl"].T.tolist()), out["edge_pl2pl_type"].tolist()))
    assert got_types == pl2pl_types
    # the radii really cut: some candidate pairs are out of range
    num_agents, num_polygons = 7, 30
    assert len(ref["edge_pl2m"]) < num_agents * num_polygons


def test_agent_frame_targets_rotate_into_the_heading_frame():
    steps = 110
    theta = 0.7
    position = np.zeros((1, steps, 3), np.float32)
    t = np.arange(steps) - 49
    direction = np.array([math.cos(theta), math.sin(theta)])
    position[0, :, :2] = np.array([100.0, -50.0]) + t[:, None] * 2.0 * direction  # straight ahead at 2 m/step
    position[0, :, 2] = 0.1 * t
    heading = np.full((1, steps), theta, np.float32)
    heading[0, 60] = theta + 0.5
    target = agent_frame_targets(position, heading, 50)
    assert target.shape == (1, 60, 4)
    np.testing.assert_allclose(target[0, :, 0], 2.0 * np.arange(1, 61), rtol=1e-4)
    np.testing.assert_allclose(target[0, :, 1], 0.0, atol=1e-3)
    np.testing.assert_allclose(target[0, :, 2], 0.1 * np.arange(1, 61), rtol=1e-4)
    assert target[0, 10, 3] == pytest.approx(0.5, abs=1e-5) and target[0, 11, 3] == pytest.approx(0.0, abs=1e-6)


def test_collate_offsets_every_edge_list_into_its_node_spaces():
    transform = make_transform("test")
    samples = [transform(random_scenario(num_agents=4 + i, num_polygons=10 + 3 * i, seed=i, extent=50.0))
               for i in range(3)]
    batch = collate_qcnet(samples)
    T, K = transform.settings.num_historical_steps, transform.settings.num_modes
    sizes = {space: sum(smp["_sizes"][space] for smp in samples) for space in samples[0]["_sizes"]}
    assert batch["agent_position"].shape == (sizes["agent"], T, 2)
    assert batch["agent_target"].shape == (sizes["agent"], 60, 4)
    assert batch["num_graphs"] == 3 and batch["agent_counts"] == [4, 5, 6]
    assert batch["agent_batch"].tolist() == [0] * 4 + [1] * 5 + [2] * 6
    assert batch["av_index"].tolist() == [0, 4, 9]
    for key, (src_space, dst_space) in EDGE_NODE_SPACES.items():
        edges = batch[key]
        assert edges.dtype == torch.int64 and edges.shape[0] == 2
        assert edges.shape[1] == sum(s[key].shape[1] for s in samples)
        assert int(edges[0].max()) < sizes[src_space] and int(edges[1].max()) < sizes[dst_space]
    # an agent-step edge of scene 2 points at scene 2's agents
    first_scene2 = sum(samples[i]["edge_t"].shape[1] for i in range(2))
    assert int(batch["edge_t"][1, first_scene2]) // T >= 9
    assert int(batch["edge_m2m"][0, -1]) // K >= 9


def test_transform_rejects_a_wrong_number_of_steps():
    scenario = random_scenario(num_agents=3, num_polygons=5)
    scenario["agent"]["position"] = scenario["agent"]["position"][:, :100]
    with pytest.raises(ValueError, match="expects"):
        QCNetTransform()(scenario)


@pytest.mark.skipif(not FIXTURE.is_dir(), reason="real Argoverse 2 fixture missing")
def test_transform_accepts_the_loaders_real_scenario():
    from drivebench.data.argoverse2.scenario import load_scenario_dir

    scenario = load_scenario_dir(next(FIXTURE.iterdir()))
    out = make_transform("paper")(scenario)
    assert out["_sizes"]["agent"] == scenario["agent"]["num_nodes"]
    focal = int(np.nonzero(scenario["agent"]["category"] == 3)[0][0])
    assert out["agent_predict_mask"][focal].all()
    # the focal agent moves forward in its own frame over the 6 s
    assert out["agent_target"][focal, -1, 0] > 1.0
    for key in ("edge_t", "edge_pl2a", "edge_a2a", "edge_pl2pl", "edge_t2m", "edge_pl2m"):
        assert out[key].shape[1] > 0, key
