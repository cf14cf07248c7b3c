"""SparseDrive's streaming state: anchor projection, carrying across steps, per-slot reset."""

from __future__ import annotations

import math

import pytest
import torch

from drivebench.models.registry import create_model
from drivebench.models.sparsedrive.boxes import (
    COS_YAW, SIN_YAW, VX, VY, X, Y, project_box_anchors, project_points_2d, rigid_inverse,
)
from test_sparsedrive_factory import make_sequence, one_torch_thread  # noqa: F401 (autouse fixture)


def _pose(x: float, y: float, yaw: float) -> torch.Tensor:
    t = torch.eye(4)
    t[:2, :2] = torch.tensor([[math.cos(yaw), -math.sin(yaw)], [math.sin(yaw), math.cos(yaw)]])
    t[0, 3], t[1, 3] = x, y
    return t


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    torch.manual_seed(0)
    net = create_model("sparsedrive", "test")
    net.eval()
    return net


def test_anchors_follow_a_known_ego_motion() -> None:
    # previous ego at the origin; now 2 m ahead and turned 90 deg left
    prev2cur = (rigid_inverse(_pose(2.0, 0.0, math.pi / 2)) @ _pose(0.0, 0.0, 0.0))[None]
    anchor = torch.zeros(1, 2, 11)
    anchor[0, 0, [X, Y]] = torch.tensor([10.0, 0.0])  # static, heading +x
    anchor[0, 0, COS_YAW] = 1.0
    anchor[0, 1, [X, Y]] = torch.tensor([0.0, 5.0])  # moving +x at 2 m/s, heading +x
    anchor[0, 1, COS_YAW] = 1.0
    anchor[0, 1, VX] = 2.0
    out = project_box_anchors(anchor, prev2cur, dt=torch.tensor([0.5]))
    # static object 10 m ahead of the old pose: 8 m ahead, seen to the right (-y) of the new pose
    torch.testing.assert_close(out[0, 0, [X, Y]], torch.tensor([0.0, -8.0]), atol=1e-5, rtol=0)
    # its heading +x is now -90 deg in the new frame
    torch.testing.assert_close(out[0, 0, [SIN_YAW, COS_YAW]], torch.tensor([-1.0, 0.0]), atol=1e-6, rtol=0)
    # the mover first advances 1 m (2 m/s x 0.5 s) to (1, 5), then the ego motion applies
    torch.testing.assert_close(out[0, 1, [X, Y]], torch.tensor([5.0, 1.0]), atol=1e-5, rtol=0)
    torch.testing.assert_close(out[0, 1, [VX, VY]], torch.tensor([0.0, -2.0]), atol=1e-5, rtol=0)
    # map polylines move the same way (ground plane)
    line = torch.tensor([[[10.0, 0.0, 0.0, 5.0]]])
    torch.testing.assert_close(project_points_2d(line, prev2cur), torch.tensor([[[0.0, -8.0, 5.0, 2.0]]]), atol=1e-5, rtol=0)


def test_temporal_context_derives_ego_motion_from_poses(model: torch.nn.Module) -> None:
    frames = make_sequence(2, batch_size=2)
    model.reset_state()
    first = model.temporal_context(frames[0])
    assert not first.has_history and not first.valid.any()
    second = model.temporal_context(frames[1])
    assert second.has_history and second.valid.all()
    moved = frames[1]["ego2global"][:, 0, 3] - frames[0]["ego2global"][:, 0, 3]
    # the ego moved forward (the lidar's +y), so the previous lidar origin is behind: y = -moved
    torch.testing.assert_close(second.prev2cur[:, 1, 3], -moved, atol=1e-4, rtol=0)
    torch.testing.assert_close(second.prev2cur[:, 0, 3], torch.zeros(2), atol=1e-4, rtol=0)
    torch.testing.assert_close(second.prev2cur[:, :3, :3], torch.eye(3).expand(2, 3, 3), atol=1e-5, rtol=0)
    torch.testing.assert_close(second.dt, torch.full((2,), 0.5))
    model.reset_state()


def test_bank_carries_instances_and_resets_where_prev_exists_is_false(model: torch.nn.Module, monkeypatch) -> None:
    frames = make_sequence(2, batch_size=2)
    bank = model.det_head.bank
    model.reset_state()
    with torch.no_grad():
        model(frames[0])
    assert bank.state is not None and bank.state.feature.shape == (2, bank.num_temp, model.dims)
    cached = bank.state.feature.clone()
    assert not cached.requires_grad

    calls = {}
    original = bank.update

    def spy(feature, anchor, cls, temp_feature, temp_anchor, valid):
        out = original(feature, anchor, cls, temp_feature, temp_anchor, valid)
        calls.update(fresh=feature.clone(), merged=out[0].clone(), valid=valid.clone())
        return out

    monkeypatch.setattr(bank, "update", spy)
    frames[1]["prev_exists"] = torch.tensor([True, False])
    with torch.no_grad():
        model(frames[1])
    assert calls["valid"].tolist() == [True, False]
    torch.testing.assert_close(calls["merged"][0, : bank.num_temp], cached[0])  # slot 0 continues
    torch.testing.assert_close(calls["merged"][1], calls["fresh"][1])  # slot 1 starts over
    model.reset_state()


def test_a_reset_slot_computes_what_a_fresh_model_computes(model: torch.nn.Module) -> None:
    frames = make_sequence(3, batch_size=2)
    model.reset_state()
    with torch.no_grad():
        model(frames[0])
        model(frames[1])
        frames[2]["prev_exists"] = torch.tensor([True, False])
        streamed = model(frames[2])
        model.reset_state()
        fresh = model(frames[2])
    for a, b in zip(streamed.det.prediction, fresh.det.prediction):
        torch.testing.assert_close(a[1], b[1], atol=1e-4, rtol=1e-4)
    # the continuing slot used its history from the first temporal layer on
    torch.testing.assert_close(streamed.det.prediction[0][0], fresh.det.prediction[0][0])
    assert not torch.allclose(streamed.det.prediction[-1][0], fresh.det.prediction[-1][0], atol=1e-4)
    torch.testing.assert_close(streamed.map.prediction[-1][1], fresh.map.prediction[-1][1], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(streamed.motion.plan_reg[-1][1], fresh.motion.plan_reg[-1][1], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(streamed.motion.motion_reg[-1][1], fresh.motion.motion_reg[-1][1], atol=1e-4, rtol=1e-4)
    model.reset_state()


def test_state_is_outside_state_dict_and_dropped_on_batch_size_change(model: torch.nn.Module) -> None:
    frames = make_sequence(2, batch_size=2)
    model.reset_state()
    keys_before = set(model.state_dict())
    with torch.no_grad():
        model(frames[0])
    assert set(model.state_dict()) == keys_before
    assert model.motion_head.queue.state is not None
    single = {k: (v[:1] if isinstance(v, torch.Tensor) else v[:1]) for k, v in frames[1].items()}
    single["gt_depth"] = [d[:1] for d in frames[1]["gt_depth"]]
    with torch.no_grad():
        model(single)
    assert model.det_head.bank.state.feature.shape[0] == 1
    assert model.motion_head.queue.state.period.shape[0] == 1
    model.reset_state()
    assert model.det_head.bank.state is None and model.motion_head.queue.state is None


def test_missing_prev_exists_is_a_clear_error(model: torch.nn.Module) -> None:
    batch = make_sequence(1, batch_size=2)[0]
    del batch["prev_exists"]
    with pytest.raises(KeyError, match="prev_exists"):
        model(batch)
