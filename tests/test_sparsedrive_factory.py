"""A factory of small, geometrically consistent SparseDrive batches (docs/batch-contract.md).

A few fixed scenes: the ego drives forward along a sequence; agents keep constant velocities;
map elements are straight lines fixed in the world. Scenes are laid out in the ego frame (x
forward, y left) and delivered in a nuScenes-like LIDAR_TOP frame (x right, y forward: the lidar
is mounted at -90 deg yaw, 1.84 m above the ground), which is what the data layer produces. Six
pinhole cameras look around the ego; ``lidar2img`` = ego->image @ lidar->ego.
"""

from __future__ import annotations

import math

import pytest
import torch

@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """The SparseDrive tests run single-threaded: tiny ops on a shared 2-core machine are faster
    without OpenMP barriers, and much faster when other processes compete for the cores."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


CAM_YAWS = (0.0, -math.radians(55), math.radians(55), math.pi, math.radians(110), -math.radians(110))


LIDAR_HEIGHT = 1.84


def lidar_to_ego() -> torch.Tensor:
    """(4, 4) lidar -> ego: lidar x points to the ego's right, lidar y forward."""
    t = torch.eye(4)
    t[:2, :2] = torch.tensor([[0.0, 1.0], [-1.0, 0.0]])
    t[2, 3] = LIDAR_HEIGHT
    return t


def ego_xy_to_lidar(xy: torch.Tensor) -> torch.Tensor:
    """(..., 2) ego-frame ground positions or displacements -> lidar frame (rotation by +90 deg)."""
    return torch.stack([-xy[..., 1], xy[..., 0]], dim=-1)


def camera_matrices(h: int, w: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(6, 4, 4) lidar2img, (6, 3, 3) intrinsics and (6, 4, 4) cam2lidar for a ring of cameras."""
    ego2img, k, cam2ego = ego_camera_matrices(h, w)
    l2e = lidar_to_ego()
    return ego2img @ l2e, k, torch.linalg.inv(l2e) @ cam2ego


def ego_camera_matrices(h: int, w: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(6, 4, 4) ego2img, (6, 3, 3) intrinsics and (6, 4, 4) cam2ego."""
    f = 0.8 * w
    k = torch.tensor([[f, 0, w / 2], [0, f, h / 2], [0, 0, 1.0]])
    # camera axes (x right, y down, z forward) in the ego frame looking along +x
    base = torch.tensor([[0.0, 0.0, 1.0], [-1.0, 0.0, 0.0], [0.0, -1.0, 0.0]])  # columns: cam x/y/z in ego
    lidar2img, cam2lidar = [], []
    for yaw in CAM_YAWS:
        rz = torch.tensor([[math.cos(yaw), -math.sin(yaw), 0.0], [math.sin(yaw), math.cos(yaw), 0.0], [0.0, 0.0, 1.0]])
        rot = rz @ base  # cam -> ego rotation
        c2l = torch.eye(4)
        c2l[:3, :3] = rot
        c2l[:3, 3] = torch.tensor([0.5, 0.0, LIDAR_HEIGHT + 0.3])
        l2c = torch.linalg.inv(c2l)
        viewpad = torch.eye(4)
        viewpad[:3, :3] = k
        lidar2img.append(viewpad @ l2c)
        cam2lidar.append(c2l)
    return torch.stack(lidar2img), k.expand(6, 3, 3).clone(), torch.stack(cam2lidar)


def _polyline_orderings(pts: torch.Tensor, num_orderings: int) -> torch.Tensor:
    """(20, 2) polyline -> (S, 20, 2): forward and reverse, padded with -10000 as upstream."""
    out = torch.full((num_orderings, pts.shape[0], 2), -10000.0)
    out[0] = pts
    out[1] = pts.flip(0)
    return out


def make_sequence(num_frames: int = 4, batch_size: int = 2, h: int = 64, w: int = 176, seed: int = 0,
                  num_orderings: int = 4) -> list[dict]:
    """``num_frames`` consecutive batches; slot b walks scene b frame by frame (prev_exists after the first)."""
    g = torch.Generator().manual_seed(seed)
    lidar2img, intr, cam2lidar = camera_matrices(h, w)
    scenes = []
    for _ in range(batch_size):
        n_agents = int(torch.randint(2, 5, (1,), generator=g))
        pos = (torch.rand(n_agents, 2, generator=g) - 0.5) * torch.tensor([40.0, 20.0])
        yaw = (torch.rand(n_agents, generator=g) - 0.5) * 2 * math.pi
        speed = torch.rand(n_agents, generator=g) * 5
        labels = torch.randint(0, 10, (n_agents,), generator=g)
        n_map = int(torch.randint(1, 4, (1,), generator=g))
        map_y = (torch.rand(n_map, generator=g) - 0.5) * 20
        map_labels = torch.randint(0, 3, (n_map,), generator=g)
        ego_speed = 2.0 + 3.0 * float(torch.rand(1, generator=g))
        scenes.append((pos, yaw, speed, labels, map_y, map_labels, ego_speed))
    images = torch.randn(batch_size, 6, 3, h, w, generator=g)
    batches = []
    for t in range(num_frames):
        batch: dict = {k: [] for k in ("gt_boxes_3d", "gt_labels_3d", "gt_instance_ids", "gt_agent_fut_trajs",
                                       "gt_agent_fut_masks", "gt_map_labels", "gt_map_pts", "gt_map_num_orderings")}
        ego2global, ego_traj = [], []
        for b, (pos, yaw, speed, labels, map_y, map_labels, ego_speed) in enumerate(scenes):
            ego_x = ego_speed * 0.5 * t
            e2g = torch.eye(4)
            e2g[0, 3] = 100.0 * b + ego_x
            ego2global.append(e2g)
            # ---- the scene in the ego frame (x forward, y left)
            vel = torch.stack([speed * torch.cos(yaw), speed * torch.sin(yaw)], -1)
            centre = pos + vel * 0.5 * t - torch.tensor([ego_x, 0.0])
            n = centre.shape[0]
            steps = torch.arange(1, 13, dtype=torch.float32)[None, :, None]
            fut = vel[:, None] * 0.5 * steps
            xs = torch.linspace(-20, 20, 20)
            lines = [torch.stack([xs, torch.full_like(xs, float(y))], -1) for y in map_y]
            ego_fut = torch.stack([ego_speed * 0.5 * torch.arange(1, 7, dtype=torch.float32), torch.zeros(6)], -1)
            # ---- delivered in the lidar frame (x right, y forward): positions rotate by +90 deg
            lidar_yaw = torch.remainder(yaw + math.pi / 2 + math.pi, 2 * math.pi) - math.pi
            size = torch.tensor([1.9, 4.5, 1.6]).expand(n, 3)  # w, l, h
            boxes = torch.cat([ego_xy_to_lidar(centre), torch.full((n, 1), -1.0), size, lidar_yaw[:, None],
                               ego_xy_to_lidar(vel)], dim=-1)
            batch["gt_boxes_3d"].append(boxes)
            batch["gt_labels_3d"].append(labels)
            batch["gt_instance_ids"].append(torch.arange(n))
            batch["gt_agent_fut_trajs"].append(ego_xy_to_lidar(fut))
            batch["gt_agent_fut_masks"].append(torch.ones(n, 12, dtype=torch.bool))
            batch["gt_map_labels"].append(map_labels)
            batch["gt_map_pts"].append(torch.stack([_polyline_orderings(ego_xy_to_lidar(p), num_orderings) for p in lines]))
            batch["gt_map_num_orderings"].append(torch.full((len(lines),), 2, dtype=torch.long))
            ego_traj.append(ego_xy_to_lidar(ego_fut))
        batch.update(
            img=images + 0.05 * t,
            img_shape=torch.tensor([h, w]).expand(batch_size, 6, 2).clone(),
            lidar2img=lidar2img.expand(batch_size, 6, 4, 4).clone(),
            cam_intrinsic=intr.expand(batch_size, 6, 3, 3).clone(),
            cam2lidar=cam2lidar.expand(batch_size, 6, 4, 4).clone(),
            lidar2ego=lidar_to_ego().expand(batch_size, 4, 4).clone(),
            ego2global=torch.stack(ego2global),
            can_bus=torch.zeros(batch_size, 18),
            timestamp=torch.full((batch_size,), 0.5 * t, dtype=torch.float64),
            sequence_id=torch.arange(batch_size),
            frame_idx=torch.full((batch_size,), t),
            prev_exists=torch.full((batch_size,), t > 0),
            gt_ego_fut_trajs=torch.stack(ego_traj),
            gt_ego_fut_masks=torch.ones(batch_size, 6, dtype=torch.bool),
            gt_ego_fut_cmd=torch.tensor([0.0, 0.0, 1.0]).expand(batch_size, 3).clone(),
            ego_status=torch.tensor([[0, 0, 0, 0, 0, 0, s[6], 0, 0, 0] for s in scenes], dtype=torch.float32),
            gt_depth=[torch.rand(batch_size, 6, h // s, w // s, generator=g) * 30 * (torch.rand(batch_size, 6, h // s, w // s, generator=g) > 0.7)
                      for s in (4, 8, 16)],
        )
        batches.append(batch)
    return batches


def test_factory_cameras_see_what_lies_in_front_of_them() -> None:
    l2i, intr, c2l = camera_matrices(64, 176)
    ego2lidar = torch.linalg.inv(lidar_to_ego())
    for cam, yaw in enumerate(CAM_YAWS):
        ahead = torch.tensor([0.5 + 10 * math.cos(yaw), 10 * math.sin(yaw), LIDAR_HEIGHT + 0.3, 1.0])  # ego frame
        pix = l2i[cam] @ ego2lidar @ ahead
        assert pix[2] > 0, f"camera {cam} sees its own forward point behind it"
        u, v = (pix[:2] / pix[2]).tolist()
        assert abs(u - 88) < 1 and abs(v - 32) < 1  # on the optical axis: the image centre
        torch.testing.assert_close(c2l[cam] @ torch.linalg.inv(c2l[cam]), torch.eye(4))
    behind = l2i[0] @ torch.tensor([0.0, -10.0, 0.0, 1.0])  # lidar frame: 10 m behind the ego
    assert behind[2] < 0
    torch.testing.assert_close(lidar_to_ego()[:3, :3] @ torch.tensor([0.0, 1.0, 0.0]), torch.tensor([1.0, 0.0, 0.0]))


def test_factory_follows_the_batch_contract() -> None:
    frames = make_sequence(2, batch_size=2)
    b0, b1 = frames
    assert b0["img"].shape == (2, 6, 3, 64, 176) and b0["lidar2img"].shape == (2, 6, 4, 4)
    assert not b0["prev_exists"].any() and b1["prev_exists"].all()
    assert b0["timestamp"].dtype == torch.float64
    for boxes, labels, trajs, masks in zip(b0["gt_boxes_3d"], b0["gt_labels_3d"], b0["gt_agent_fut_trajs"],
                                           b0["gt_agent_fut_masks"]):
        assert boxes.shape[1] == 9 and labels.shape == boxes.shape[:1]
        assert trajs.shape == (len(boxes), 12, 2) and masks.dtype == torch.bool
    # agents move consistently: the next frame's centre = this centre + first future offset - ego motion
    ego_step = (b1["ego2global"][:, 0, 3] - b0["ego2global"][:, 0, 3])
    for i in range(2):
        expected = b0["gt_boxes_3d"][i][:, :2] + b0["gt_agent_fut_trajs"][i][:, 0]
        expected[:, 1] -= ego_step[i]  # the ego drives along the lidar's +y
        torch.testing.assert_close(b1["gt_boxes_3d"][i][:, :2], expected)
    pts = b0["gt_map_pts"][0]
    assert pts.shape[2:] == (20, 2) and (pts[:, 2:] == -10000).all()
