"""GaussianFormer's plain-PyTorch replacements of upstream CUDA ops, against brute-force references."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from drivebench.models.gaussianformer.deformable import DeformableAggregation, project_to_cameras
from drivebench.models.gaussianformer.geometry import (
    GaussianSet, GridSpec, covariance, gaussian_axes, precision_matrix, quaternion_to_rotation,
)
from drivebench.models.gaussianformer.head import GaussianOccupancyHead
from drivebench.models.gaussianformer.image_encoder import ModulatedDeformConv2d
from drivebench.models.gaussianformer.sparse_conv import (
    GaussianSparseConv, build_rulebook, kernel_offsets, submanifold_conv3d,
)
from drivebench.models.gaussianformer.splat import splat_gaussians, window_radius

@pytest.fixture(scope="module", autouse=True)
def single_thread():
    """Tiny tensors gain nothing from intra-op threads; on a shared 2-core box they only contend."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


GRID = GridSpec(shape=(6, 5, 4), lower=(-3.0, -2.5, -1.0), voxel_size=1.0)


def _random_gaussians(b: int, g: int, c: int, grid: GridSpec, scale_range=(0.3, 0.9), seed: int = 0,
                      dtype=torch.float64) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    lo, hi = torch.tensor(grid.lower, dtype=dtype), torch.tensor(grid.upper, dtype=dtype)
    means = lo + torch.rand(b, g, 3, generator=gen, dtype=dtype) * (hi - lo)
    scales = scale_range[0] + torch.rand(b, g, 3, generator=gen, dtype=dtype) * (scale_range[1] - scale_range[0])
    rotations = F.normalize(torch.randn(b, g, 4, generator=gen, dtype=dtype), dim=-1)
    opacities = torch.rand(b, g, generator=gen, dtype=dtype)
    semantics = torch.rand(b, g, c, generator=gen, dtype=dtype)
    return means, scales, rotations, opacities, semantics


def _dense_splat(means, scales, rotations, opacities, semantics, grid: GridSpec, max_radius: int) -> torch.Tensor:
    """Every Gaussian x every voxel, with upstream's window rule applied as a mask: (B, V, C)."""
    centres = grid.voxel_centers(dtype=means.dtype).reshape(-1, 3)  # (V, 3)
    voxel_idx = torch.stack(torch.meshgrid(*[torch.arange(n) for n in grid.shape], indexing="ij"), -1).reshape(-1, 3)
    cov = covariance(scales, rotations)
    prec = torch.linalg.inv(cov)  # the reference uses a generic inverse
    d = centres[None, None] - means[:, :, None]  # (B, G, V, 3)
    power = -0.5 * torch.einsum("bgvi,bgij,bgvj->bgv", d, prec, d)
    centre_idx = torch.floor((means.detach() - torch.tensor(grid.lower, dtype=means.dtype)) / grid.voxel_size).long()
    radius = torch.ceil(scales.detach().amax(-1) * 3.0 / grid.voxel_size).long().clamp(1, max_radius)
    cheb = (voxel_idx[None, None] - centre_idx[:, :, None]).abs().amax(-1)  # (B, G, V)
    window = cheb <= radius[..., None]
    weight = opacities[..., None] * torch.exp(power) * window
    return torch.einsum("bgv,bgc->bvc", weight, semantics)


def test_precision_matrix_matches_linalg_inverse():
    gen = torch.Generator().manual_seed(1)
    scales = 0.05 + torch.rand(50, 3, generator=gen, dtype=torch.float64)
    rotations = torch.randn(50, 4, generator=gen, dtype=torch.float64)
    expected = torch.linalg.inv(covariance(scales, rotations))
    torch.testing.assert_close(precision_matrix(scales, rotations), expected, rtol=1e-9, atol=1e-9)
    rot = quaternion_to_rotation(rotations)
    torch.testing.assert_close(rot @ rot.transpose(-1, -2), torch.eye(3, dtype=torch.float64).expand(50, 3, 3))
    torch.testing.assert_close(torch.linalg.det(rot), torch.ones(50, dtype=torch.float64))


def test_gaussian_axes_are_upstream_convention():
    """Axes are the columns of R^T (upstream): identity quaternion -> I; for a +90 deg turn about z the first
    axis is R^T e_x = -y."""
    q = torch.tensor([[1.0, 0.0, 0.0, 0.0], [math.cos(math.pi / 4), 0.0, 0.0, math.sin(math.pi / 4)]])
    axes = gaussian_axes(q)
    torch.testing.assert_close(axes[0], torch.eye(3))
    torch.testing.assert_close(axes[1][:, 0], torch.tensor([0.0, -1.0, 0.0]), atol=1e-6, rtol=0)
    # covariance is elongated along the axes: Sigma a_k = s_k^2 a_k
    s = torch.tensor([[2.0, 0.5, 0.3]]).expand(2, 3)
    sigma = covariance(s, q)
    torch.testing.assert_close(sigma[1] @ axes[1][:, 0], 4.0 * axes[1][:, 0], atol=1e-5, rtol=0)


@pytest.mark.parametrize("window", ["radius", "max"])
def test_splat_matches_dense_reference_values_and_gradients(window):
    b, g, c = 2, 9, 5
    max_radius = window_radius(0.9, GRID.voxel_size)
    inputs = [t.requires_grad_() for t in _random_gaussians(b, g, c, GRID, scale_range=(0.1, 0.9))]
    radii = torch.ceil(inputs[1].detach().amax(-1) * 3.0 / GRID.voxel_size).clamp(1, max_radius)
    assert len(set(radii.flatten().tolist())) == 3  # three radius buckets (1, 2, 3 voxels)
    # a chunk of 2 max-windows forces several chunks per bucket, including partial ones
    out = splat_gaussians(*inputs, GRID, max_radius, chunk_pairs=2 * (2 * max_radius + 1) ** 3,
                          window=window).double()
    ref_inputs = [t.detach().clone().requires_grad_() for t in inputs]
    ref = _dense_splat(*ref_inputs, GRID, max_radius)
    torch.testing.assert_close(out, ref.float().double(), rtol=1e-4, atol=1e-5)
    assert out.abs().sum() > 0
    upstream = torch.randn_like(ref)
    grads = torch.autograd.grad((out * upstream).sum(), inputs)
    ref_grads = torch.autograd.grad((ref * upstream).sum(), ref_inputs)
    for name, got, want in zip(("means", "scales", "rotations", "opacities", "semantics"), grads, ref_grads):
        assert want.abs().sum() > 0, name
        torch.testing.assert_close(got.double(), want, rtol=2e-3, atol=2e-4, msg=lambda m: f"grad {name}: {m}")


def test_splat_window_clips_far_voxels_and_batches_do_not_mix():
    means = torch.tensor([[[0.5, 0.5, 0.5]], [[-2.5, -2.0, -0.5]]])
    scales = torch.full((2, 1, 3), 0.2)  # radius ceil(0.6) = 1 voxel
    rot = torch.tensor([1.0, 0.0, 0.0, 0.0]).expand(2, 1, 4)
    out = splat_gaussians(means, scales, rot, torch.ones(2, 1), torch.ones(2, 1, 1), GRID, max_radius=3)
    out = out.view(2, *GRID.shape)
    touched = out > 0
    assert touched[0].sum() == 27 and touched[1].sum() == 8  # full 3^3 window; corner voxel clipped to 2^3
    assert touched[0, 3, 3, 1] and not touched[0, 0, 0, 0] and touched[1, 0, 0, 0]


def test_head_empty_gaussian_and_shapes():
    head = GaussianOccupancyHead(GRID, num_classes=4, empty_label=3, max_scale=0.9, with_empty=True,
                                 empty_mean=(0.0, 0.0, 0.0), empty_scale=(3.0, 3.0, 2.0))
    gs = _random_gaussians(2, 5, 3, GRID, dtype=torch.float32)
    gaussians = GaussianSet(gs[0], gs[1], gs[2], gs[3].unsqueeze(-1), gs[4])
    out = head(gaussians)
    assert out.shape == (2, 4, *GRID.shape)
    without = splat_gaussians(gs[0], gs[1], gs[2], gs[3], torch.cat([gs[4], torch.zeros(2, 5, 1)], -1), GRID,
                              head.max_radius).view(2, *GRID.shape, 4).permute(0, 4, 1, 2, 3)
    empty = out - without
    torch.testing.assert_close(empty[:, :3], torch.zeros_like(empty[:, :3]))
    centre = GRID.voxel_centers()
    expected = 10.0 * torch.exp(-0.5 * ((centre / torch.tensor([3.0, 3.0, 2.0])) ** 2).sum(-1))
    torch.testing.assert_close(empty[0, 3], expected)
    with pytest.raises(ValueError, match="semantic channels"):
        head(GaussianSet(gs[0], gs[1], gs[2], gs[3].unsqueeze(-1), torch.rand(2, 5, 4)))


def _dense_submanifold_reference(features, coords, batch_index, weight, shape, kernel_size):
    """Scatter-mean into a dense grid, conv3d (cross-correlation, zero padding), read back at the points."""
    b = int(batch_index.max()) + 1
    c_in, c_out = weight.shape[1], weight.shape[2]
    dense = torch.zeros(b, c_in, *shape, dtype=features.dtype)
    count = torch.zeros(b, 1, *shape, dtype=features.dtype)
    bi, x, y, z = batch_index, coords[:, 0], coords[:, 1], coords[:, 2]
    for i in range(features.shape[0]):
        dense[bi[i], :, x[i], y[i], z[i]] += features[i]
        count[bi[i], 0, x[i], y[i], z[i]] += 1
    dense = dense / count.clamp(min=1)
    k = kernel_size
    w = weight.view(k, k, k, c_in, c_out).permute(4, 3, 0, 1, 2)
    out = F.conv3d(dense, w, padding=k // 2)
    return out[bi, :, x, y, z]


def _random_voxels(gen: torch.Generator, shape, per_batch: int, batches: int = 2, duplicates: int = 0):
    coords, batch_index = [], []
    for b in range(batches):
        flat = torch.randperm(math.prod(shape), generator=gen)[:per_batch]
        if duplicates:
            flat = torch.cat([flat, flat[:duplicates]])  # these voxels hold two points each
        coords.append(torch.stack([flat // (shape[1] * shape[2]), (flat // shape[2]) % shape[1], flat % shape[2]], -1))
        batch_index.append(torch.full((flat.shape[0],), b))
    return torch.cat(coords), torch.cat(batch_index)


@pytest.mark.parametrize("impl", ["rulebook", "dense"])
@pytest.mark.parametrize("duplicates", [False, True])
def test_submanifold_conv_matches_dense_conv3d_on_occupied_voxels(duplicates, impl):
    gen = torch.Generator().manual_seed(3)
    shape, k, c_in, c_out = (7, 6, 5), 3, 4, 3
    m_per_batch = 40
    coords, batch_index = _random_voxels(gen, shape, m_per_batch, duplicates=10 if duplicates else 0)
    features = torch.randn(coords.shape[0], c_in, generator=gen, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(k ** 3, c_in, c_out, generator=gen, dtype=torch.float64, requires_grad=True)
    # a small chunk forces several GEMM chunks over the offsets, including a partial one
    out = submanifold_conv3d(features, coords, batch_index, weight, shape, chunk_elements=c_in * coords.shape[0] * 4,
                             impl=impl)
    ref = _dense_submanifold_reference(features, coords, batch_index, weight, shape, k)
    torch.testing.assert_close(out, ref)
    if duplicates:  # points sharing a voxel (last ten of batch 1 repeat its first ten) read the same output
        first_of_batch1 = m_per_batch + 10
        torch.testing.assert_close(out[-10:], out[first_of_batch1:first_of_batch1 + 10])
    g = torch.randn_like(out)
    grads = torch.autograd.grad((out * g).sum(), (features, weight))
    ref_grads = torch.autograd.grad((ref * g).sum(), (features, weight))
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("seed", [0, 1])
def test_rulebook_holds_exactly_the_occupied_pairs(seed):
    """Brute force: every ordered pair of occupied voxels of one sample whose offset lies in the 5^3 window."""
    gen = torch.Generator().manual_seed(seed)
    shape, ksize = (9, 8, 6), 5
    coords, batch_index = _random_voxels(gen, shape, per_batch=60, duplicates=5)
    nbrs, book = build_rulebook(coords, batch_index, shape, ksize)
    offsets = kernel_offsets(ksize)
    got = set()
    for row in range(book.in_slots.shape[0]):
        for i, o in zip(book.in_slots[row].tolist(), book.out_slots[row].tolist()):
            if i < book.num_slots:
                got.add((i, o, int(book.offset_ids[row])))
    # the same pairs in terms of voxel coordinates (slots are an internal numbering)
    slot_coord, slot_batch = {}, {}
    for p, s in enumerate(nbrs.slot_of_point.tolist()):
        slot_coord[s], slot_batch[s] = tuple(coords[p].tolist()), int(batch_index[p])
    got_coords = {(slot_batch[i], slot_coord[i], slot_coord[o], k) for i, o, k in got}
    voxels = sorted({(int(b), tuple(c)) for b, c in zip(batch_index.tolist(), coords.tolist())})
    want = set()
    for b_out, c_out in voxels:
        for b_in, c_in in voxels:
            d = tuple(ci - co for ci, co in zip(c_in, c_out))
            if b_in == b_out and d != (0, 0, 0) and max(abs(v) for v in d) <= ksize // 2:
                k = next(j for j, off in enumerate(offsets.tolist()) if tuple(off) == d)
                want.add((b_in, c_in, c_out, k))
    assert got_coords == want and len(want) > 0
    assert book.num_pairs == len(want) and book.num_voxels == len(voxels)
    macs = book.macs(8, 8)
    assert macs["pairs_exact"] == (len(voxels) + len(want)) * 64
    assert macs["pairs_exact"] <= macs["rulebook_padded"] < macs["dense_window"]


def test_kernel_offsets_order_matches_conv3d_weight_layout():
    offs = kernel_offsets(3)
    assert offs.shape == (27, 3)
    assert offs[0].tolist() == [-1, -1, -1] and offs[1].tolist() == [-1, -1, 0] and offs[13].tolist() == [0, 0, 0]


def test_gaussian_sparse_conv_module_voxelises_means():
    conv = GaussianSparseConv(8, (-4.0, -4.0, -2.0), (4.0, 4.0, 2.0), voxel_size=1.0, kernel_size=3, use_out_proj=False)
    assert conv.spatial_shape == (8, 8, 4)
    means = torch.tensor([[[-3.9, -3.9, -1.9], [-3.2, -3.5, -1.1], [3.99, 3.99, 1.99]]])
    coords = conv.voxelise(means)
    assert coords.tolist() == [[[0, 0, 0], [0, 0, 0], [7, 7, 3]]]
    out = conv(torch.randn(1, 3, 8), means)
    torch.testing.assert_close(out[0, 0], out[0, 1])  # same voxel, same output
    assert out.shape == (1, 3, 8)


def test_projection_visibility_and_zero_weight_for_invisible_points():
    """A camera at the origin looking along +x: points behind it or outside the valid region are invisible."""
    h, w, f = 40, 60, 30.0
    cam2lidar = torch.eye(4)
    cam2lidar[:3, :3] = torch.tensor([[0.0, 0.0, 1.0], [-1.0, 0.0, 0.0], [0.0, -1.0, 0.0]])
    k = torch.eye(4)
    k[:3, :3] = torch.tensor([[f, 0, w / 2], [0, f, h / 2], [0, 0, 1]])
    lidar2img = (k @ torch.linalg.inv(cam2lidar)).view(1, 1, 4, 4)
    pts = torch.tensor([[5.0, 0.0, 0.0], [-5.0, 0.0, 0.0], [5.0, 20.0, 0.0], [5.0, -4.0, 0.0]]).view(1, 4, 1, 3)
    img_shape = torch.tensor([[[h, 50]]])  # valid width 50 of a 64-wide padded image
    uv, visible = project_to_cameras(pts, lidar2img, img_shape, padded_hw=(48, 64))
    # x=5, y=-4 projects to u = 30 + 30 * 4 / 5 = 54: inside the padded image, outside the valid 50 columns
    assert visible.view(-1).tolist() == [True, False, False, False]
    torch.testing.assert_close(uv[0, 0, 0, 0], torch.tensor([30.0 / 64, 20.0 / 48]))

    agg = DeformableAggregation(embed_dims=8, num_groups=2, num_levels=1, num_cams=1, num_learnable_points=0,
                                attn_drop=0.0).eval()
    torch.nn.init.normal_(agg.weights_fc.weight)  # non-uniform weights
    means = torch.tensor([[[5.0, 0.0, 0.0], [-5.0, 0.0, 0.0]]])  # visible / behind the camera
    gaussians = GaussianSet(means, torch.full((1, 2, 3), 0.1), torch.tensor([1.0, 0, 0, 0]).expand(1, 2, 4),
                            torch.ones(1, 2, 1), torch.ones(1, 2, 1))
    feats = [torch.randn(1, 1, 8, 12, 16)]
    inst = torch.randn(1, 2, 8)
    out = agg(inst, torch.zeros_like(inst), gaussians, feats, lidar2img, img_shape, (48, 64))
    bias = agg.output_proj.bias
    torch.testing.assert_close(out[0, 1, :8], bias)  # nothing visible -> aggregated features are zero
    assert not torch.allclose(out[0, 0, :8], bias)
    torch.testing.assert_close(out[..., 8:], inst)


def test_deformable_conv_at_init_is_half_the_plain_conv():
    conv = torch.nn.Conv2d(4, 6, 3, stride=2, padding=1, bias=False)
    dcn = ModulatedDeformConv2d(conv)
    x = torch.randn(2, 4, 9, 11)
    torch.testing.assert_close(dcn(x), 0.5 * conv(x), rtol=1e-5, atol=1e-5)
    dcn(x).sum().backward()
    assert dcn.offset_conv.weight.grad is not None and dcn.offset_conv.weight.grad.abs().sum() > 0


def test_deformable_conv_under_cpu_bf16_autocast_runs_in_fp32_as_under_cuda_autocast():
    """torchvision has no bf16 CPU kernel for deform_conv2d and no CPU autocast rule for it (its CUDA rule runs
    fp32 and casts back): a bf16 input from the layer before now gets that rule on the CPU too."""
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(4, 6, 3, padding=1, bias=True)
    dcn = ModulatedDeformConv2d(conv)
    torch.nn.init.normal_(dcn.offset_conv.weight, std=0.1)  # offsets off the grid: the sampling is exercised
    x = torch.randn(2, 4, 9, 11)
    reference = dcn(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = dcn(x.bfloat16())  # what a bf16 conv before it hands over
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), reference, rtol=0.05, atol=0.05)
    out.float().sum().backward()
    assert dcn.weight.grad is not None and dcn.offset_conv.weight.grad.abs().sum() > 0
