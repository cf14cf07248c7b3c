"""GKT spatial cross-attention and camera projection of MapTR's BEV encoder, against brute force."""

from __future__ import annotations

import torch

from drivebench.models.maptr.geometry import pillar_reference_points_3d, project_to_cameras
from drivebench.models.maptr.gkt import GeometryKernelAttention, GeometrySpatialCrossAttention, kernel_offsets
from drivebench.models.maptr.synthetic import camera_rig


def _brute_force_gkt(attn: GeometryKernelAttention, query, value, feat_hw, ref_uv):
    """Loop over every (sample, camera, query, head, tap): round, clip, weight, sum."""
    b, n, s, c = value.shape
    q = query.shape[1]
    heads = attn.num_heads
    dh = c // heads
    h_f, w_f = feat_hw
    weights = attn.attention_weights(query).view(b, q, heads, -1).softmax(-1)
    v = attn.value_proj(value)
    out = torch.zeros(b, n, q, c, dtype=value.dtype)
    offsets = kernel_offsets((3, 5)).tolist()
    for bi in range(b):
        for ni in range(n):
            for qi in range(q):
                for hi in range(heads):
                    u = float(ref_uv[bi, ni, qi, hi, 0]) * w_f
                    t = float(ref_uv[bi, ni, qi, hi, 1]) * h_f
                    acc = torch.zeros(dh, dtype=value.dtype)
                    for k, (dx, dy) in enumerate(offsets):
                        x = min(max(round(u + dx), 0), w_f - 1)
                        y = min(max(round(t + dy), 0), h_f - 1)
                        acc = acc + weights[bi, qi, hi, k] * v[bi, ni, y * w_f + x, hi * dh:(hi + 1) * dh]
                    out[bi, ni, qi, hi * dh:(hi + 1) * dh] = acc
    return out


def test_kernel_offsets_cover_a_3x5_window_dx_major():
    off = kernel_offsets((3, 5))
    assert off.shape == (15, 2)
    assert sorted(map(tuple, off.tolist())) == sorted((dx, dy) for dx in range(-2, 3) for dy in range(-1, 2))
    assert off[:3].tolist() == [[-2, -1], [-2, 0], [-2, 1]]  # upstream's meshgrid(x, y) order


def test_gkt_matches_brute_force_gather_including_clipped_taps():
    torch.manual_seed(0)
    b, n, q, c, heads, feat_hw = 2, 3, 7, 16, 4, (5, 6)
    attn = GeometryKernelAttention(c, heads).double()
    torch.nn.init.normal_(attn.attention_weights.weight)  # non-uniform weights
    query = torch.randn(b, q, c, dtype=torch.float64)
    value = torch.randn(b, n, feat_hw[0] * feat_hw[1], c, dtype=torch.float64)
    ref_uv = torch.rand(b, n, q, heads, 2, dtype=torch.float64) * 1.4 - 0.2  # some outside: clipped
    got = attn(query, value, feat_hw, ref_uv)
    want = _brute_force_gkt(attn, query, value, feat_hw, ref_uv)
    torch.testing.assert_close(got, want)


def test_gkt_gradients_match_brute_force():
    torch.manual_seed(1)
    b, n, q, c, heads, feat_hw = 1, 2, 4, 8, 4, (3, 4)
    attn = GeometryKernelAttention(c, heads).double()
    query = torch.randn(b, q, c, dtype=torch.float64, requires_grad=True)
    value = torch.randn(b, n, 12, c, dtype=torch.float64, requires_grad=True)
    ref_uv = torch.rand(b, n, q, heads, 2, dtype=torch.float64)
    grads = torch.autograd.grad(attn(query, value, feat_hw, ref_uv).square().sum(), (query, value))
    want = torch.autograd.grad(_brute_force_gkt(attn, query, value, feat_hw, ref_uv).square().sum(), (query, value))
    for g, w in zip(grads, want):
        torch.testing.assert_close(g, w)


def test_spatial_cross_attention_averages_over_cameras_that_see_the_query():
    torch.manual_seed(2)
    b, n, q, c, feat_hw = 1, 3, 4, 8, (4, 4)
    sca = GeometrySpatialCrossAttention(c, 4, dropout=0.0).double().eval()
    query = torch.randn(b, q, c, dtype=torch.float64)
    value = torch.randn(b, n, 16, c, dtype=torch.float64)
    ref_uv = torch.rand(b, n, q, 4, 2, dtype=torch.float64)
    visible = torch.zeros(b, n, q, 4, dtype=torch.bool)
    visible[0, 0, 0, 2] = True  # query 0: camera 0 only (one anchor is enough)
    visible[0, 1, 1, 0] = visible[0, 2, 1, 3] = True  # query 1: cameras 1 and 2
    # query 2, 3: seen by no camera
    per_cam = sca.attention(query, value, feat_hw, ref_uv)
    out = sca(query, value, feat_hw, ref_uv, visible)
    proj = sca.output_proj
    torch.testing.assert_close(out[0, 0], proj(per_cam[0, 0, 0]) + query[0, 0])
    torch.testing.assert_close(out[0, 1], proj((per_cam[0, 1, 1] + per_cam[0, 2, 1]) / 2) + query[0, 1])
    torch.testing.assert_close(out[0, 2], proj(torch.zeros(c, dtype=torch.float64)) + query[0, 2])


def test_projection_of_a_point_ahead_lands_in_the_front_camera_centre_only():
    rig = camera_rig((64, 96))
    points = torch.tensor([[[10.0, 0.0, -0.3]]])  # straight ahead at camera height
    uv, visible = project_to_cameras(points, rig["lidar2img"][None], (64, 96))
    assert visible[0, :, 0, 0].tolist() == [True, False, False, False, False, False]
    torch.testing.assert_close(uv[0, 0, 0, 0], torch.tensor([0.5, 0.5]))
    behind = torch.tensor([[[-10.0, 0.0, -0.3]]])
    uv_b, vis_b = project_to_cameras(behind, rig["lidar2img"][None], (64, 96))
    assert vis_b[0, :, 0, 0].tolist() == [False, False, False, True, False, False]


def test_pillar_anchors_match_upstream_heights_and_grid_layout():
    ref = pillar_reference_points_3d(4, 2, (-15.0, -30.0, -2.0, 15.0, 30.0, 2.0), 4)
    assert ref.shape == (8, 4, 3)
    torch.testing.assert_close(ref[0, :, 2], torch.tensor([-1.5, -0.5, 0.5, 1.5]))
    torch.testing.assert_close(ref[0, 0, :2], torch.tensor([-7.5, -22.5]))  # row 0 = lowest y
    torch.testing.assert_close(ref[1, 0, :2], torch.tensor([7.5, -22.5]))  # next column = larger x
