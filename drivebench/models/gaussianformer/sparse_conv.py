"""Submanifold sparse 3D convolution among Gaussians, in plain PyTorch (replaces spconv ``SubMConv3d``).

Gaussian means are voxelised; every occupied voxel gets an output computed from the occupied voxels
in its k^3 neighbourhood only (submanifold: the sparsity pattern does not dilate). Neighbours are found
by sorting the voxel keys and ``searchsorted`` (no hash table).

Two implementations (``impl``):

* ``rulebook`` (default): spconv's scheme. For each kernel offset, the list of (input voxel, output
  voxel) pairs that are both occupied; then gather -> GEMM -> scatter per offset. The centre offset
  pairs every voxel with itself (one dense GEMM); the other offsets come in mirror pairs (offset d
  and -d hold the same pairs with input and output swapped), so only half of them are looked up.
  To run every offset in one batched GEMM, each offset's pairs are padded to the largest count over
  offsets; knowing that count is one device-to-host synchronisation per call (the rulebook is then
  reused by the backward pass, not rebuilt). Work: (voxels + offsets x that count) x C_in x C_out
  multiply-adds, against spconv's (voxels + pairs) x C_in x C_out; ``Rulebook.macs`` gives both.
* ``dense``: all k^3 offsets for every voxel, masked where the neighbour is empty (k^3 x voxels x
  C_in x C_out, about 23x spconv's work for GaussianFormer's initial Gaussians) and no host sync.

Both run inside custom autograd functions so no (pairs x C) tensor is kept for backward.

Several Gaussians in one voxel: spconv keeps one arbitrary representative of the duplicates in its
hash table; here the voxel's input is the mean of their features (deterministic), and every Gaussian
reads its voxel's output. With one Gaussian per voxel the two are identical.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import nn

from drivebench.models.gaussianformer.geometry import cube_offsets, inside_grid, linear_voxel_index, voxel_index

SPARSE_CONV_IMPLS = ("rulebook", "dense")
_EMPTY_KEY = torch.iinfo(torch.int64).max  # larger than any real key: keeps unused slots at the end


def kernel_offsets(kernel_size: int, device: torch.device | None = None) -> torch.Tensor:
    """(k^3, 3) integer offsets in lexicographic (dx, dy, dz) order, from -r to r (matches conv3d weight order).

    Offset ``i`` and offset ``k^3 - 1 - i`` are mirror images; ``k^3 // 2`` is the centre.
    """
    return cube_offsets(kernel_size // 2, device)


class VoxelNeighbours:
    """Unique occupied voxels of a point set and, for each, the slot of every neighbour in a set of offsets.

    All tensors have fixed sizes (M slots for M points; slots past the number of distinct voxels are
    unused), so building this needs no device-to-host synchronisation.

    Attributes:
        slot_of_point: (M,) slot (distinct voxel) of each input point.
        count: (M,) number of points per slot (0 for unused slots).
        neighbours: (M, K) slot of the neighbour at each offset, -1 where unoccupied; K = k^3, or the
            k^3 // 2 offsets before the centre when ``half=True``.
    """

    def __init__(self, coords: torch.Tensor, batch_index: torch.Tensor, spatial_shape: Sequence[int],
                 kernel_size: int, half: bool = False) -> None:
        m = coords.shape[0]
        device = coords.device
        keys = linear_voxel_index(coords, spatial_shape, batch_index)
        sorted_keys, order = torch.sort(keys)
        is_new = torch.ones_like(sorted_keys, dtype=torch.bool)
        is_new[1:] = sorted_keys[1:] != sorted_keys[:-1]
        slot_sorted = torch.cumsum(is_new.long(), 0) - 1
        self.slot_of_point = torch.empty_like(slot_sorted).scatter_(0, order, slot_sorted)
        slot_keys = torch.full((m,), _EMPTY_KEY, dtype=torch.long, device=device).scatter_(0, slot_sorted, sorted_keys)
        self.count = torch.zeros(m, dtype=torch.long, device=device).index_add_(
            0, self.slot_of_point, torch.ones_like(self.slot_of_point)
        )
        self.used = self.count > 0

        sx, sy, sz = spatial_shape
        safe_keys = torch.where(self.used, slot_keys, torch.zeros_like(slot_keys))
        slot_coords = torch.stack([(safe_keys // (sz * sy)) % sx, (safe_keys // sz) % sy, safe_keys % sz], dim=-1)
        slot_batch = safe_keys // (sz * sy * sx)

        offsets = kernel_offsets(kernel_size, device)
        if half:
            offsets = offsets[: offsets.shape[0] // 2]
        nb = slot_coords.unsqueeze(1) + offsets.unsqueeze(0)  # (M, K, 3)
        inside = inside_grid(nb, spatial_shape) & self.used.unsqueeze(1)
        nb_keys = linear_voxel_index(nb, spatial_shape, slot_batch.unsqueeze(1))
        pos = torch.searchsorted(slot_keys, nb_keys).clamp(max=m - 1)
        found = inside & (slot_keys[pos] == nb_keys)
        self.neighbours = torch.where(found, pos, torch.full_like(pos, -1))


class Rulebook:
    """Per kernel offset, the (input slot, output slot) pairs of occupied voxels, padded to one length.

    Attributes:
        in_slots, out_slots: (k^3 - 1, cap) long, for the non-centre offsets in ``offset_ids`` order;
            padding points at slot M (a zero input row / a discarded output row).
        offset_ids: (k^3 - 1,) index of each row's offset in ``kernel_offsets`` (weight) order.
        centre: index of the centre offset.
        num_slots: M; ``num_voxels``: occupied voxels; ``num_pairs``: real non-centre pairs; ``cap``:
            padded length (host integers: read once, at build time).
    """

    def __init__(self, nbrs: VoxelNeighbours, kernel_volume: int) -> None:
        half = nbrs.neighbours  # (M, H): neighbour slot at each offset before the centre
        m, h = half.shape
        device = half.device
        valid = half >= 0
        rank = torch.cumsum(valid.long(), dim=0) - 1  # position of each pair within its offset's list
        counts = valid.sum(0)
        stats = torch.stack([counts.max() if h else counts.new_zeros(()), counts.sum(), nbrs.used.sum()])
        cap, half_pairs, voxels = (int(v) for v in stats.tolist())  # the one host sync
        self.num_slots, self.cap = m, cap
        self.num_voxels, self.num_pairs = voxels, 2 * half_pairs
        self.centre = kernel_volume // 2
        columns = torch.arange(h, device=device).expand(m, h)
        flat = torch.where(valid, columns * cap + rank, torch.full_like(rank, h * cap))  # invalid -> trash slot
        outputs = torch.arange(m, device=device).unsqueeze(1).expand(m, h)
        neighbour_of = torch.full((h * cap + 1,), m, dtype=torch.long, device=device)
        neighbour_of.scatter_(0, flat.reshape(-1), half.reshape(-1))
        owner_of = torch.full((h * cap + 1,), m, dtype=torch.long, device=device)
        owner_of.scatter_(0, flat.reshape(-1), outputs.reshape(-1))
        neighbour_of, owner_of = neighbour_of[:-1].view(h, cap), owner_of[:-1].view(h, cap)
        # offset i < centre: output reads its neighbour; mirror offset k^3-1-i: the neighbour reads the output
        self.in_slots = torch.cat([neighbour_of, owner_of])
        self.out_slots = torch.cat([owner_of, neighbour_of])
        ids = torch.arange(h, device=device)
        self.offset_ids = torch.cat([ids, kernel_volume - 1 - ids])

    def macs(self, c_in: int, c_out: int) -> dict[str, int]:
        """Multiply-adds of one forward: as run here (padded), spconv's exact pairs, and the dense k^3 window."""
        per = c_in * c_out
        return {
            "rulebook_padded": (self.num_slots + self.in_slots.shape[0] * self.cap) * per,
            "pairs_exact": (self.num_voxels + self.num_pairs) * per,
            "dense_window": self.num_slots * (self.in_slots.shape[0] + 1) * per,
        }


def _chunk_rows(rows: int, width: int, c: int, chunk_elements: int) -> int:
    return max(1, min(rows, chunk_elements // max(1, width * c)))


class _RulebookConv(torch.autograd.Function):
    """out[o] = x[o] W_centre + sum over pairs (i -> o) at offset k of x[i] W_k; batched GEMMs over offsets."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, in_slots: torch.Tensor, out_slots: torch.Tensor,
                offset_ids: torch.Tensor, centre: int, chunk_elements: int) -> torch.Tensor:
        m, c_in = x.shape
        c_out = weight.shape[2]
        out = torch.zeros(m + 1, c_out, dtype=x.dtype, device=x.device)  # row m: discarded padding output
        out[:m] = (x @ weight[centre]).to(x.dtype)
        x_pad = torch.cat([x, x.new_zeros(1, c_in)])
        rows, cap = in_slots.shape
        step = _chunk_rows(rows, cap, max(c_in, c_out), chunk_elements)
        if cap:
            for s in range(0, rows, step):
                gathered = x_pad[in_slots[s:s + step]]  # (kc, cap, C_in)
                part = torch.bmm(gathered, weight[offset_ids[s:s + step]]).to(x.dtype)
                out.index_add_(0, out_slots[s:s + step].reshape(-1), part.reshape(-1, c_out))
        ctx.save_for_backward(x, weight, in_slots, out_slots, offset_ids)
        ctx.centre, ctx.chunk_elements = centre, chunk_elements
        return out[:m]

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight, in_slots, out_slots, offset_ids = ctx.saved_tensors
        m, c_in = x.shape
        c_out = weight.shape[2]
        grad_out = grad_out.to(x.dtype).contiguous()
        need_x, need_w = ctx.needs_input_grad[:2]
        grad_x = (grad_out @ weight[ctx.centre].t()).to(x.dtype) if need_x else None
        grad_w = torch.zeros_like(weight) if need_w else None
        if grad_w is not None:
            grad_w[ctx.centre] = x.t() @ grad_out
        rows, cap = in_slots.shape
        if cap:
            g_pad = torch.cat([grad_out, grad_out.new_zeros(1, c_out)])
            x_pad = torch.cat([x, x.new_zeros(1, c_in)])
            if grad_x is not None:
                grad_x = torch.cat([grad_x, grad_x.new_zeros(1, c_in)])
            step = _chunk_rows(rows, cap, max(c_in, c_out), ctx.chunk_elements)
            for s in range(0, rows, step):
                ids = offset_ids[s:s + step]
                g = g_pad[out_slots[s:s + step]]  # (kc, cap, C_out)
                if grad_w is not None:
                    grad_w.index_add_(0, ids, torch.bmm(x_pad[in_slots[s:s + step]].transpose(1, 2), g))
                if grad_x is not None:
                    back = torch.bmm(g, weight[ids].transpose(1, 2)).to(x.dtype)
                    grad_x.index_add_(0, in_slots[s:s + step].reshape(-1), back.reshape(-1, c_in))
            if grad_x is not None:
                grad_x = grad_x[:m]
        return grad_x, grad_w, None, None, None, None, None


class _GatherConv(torch.autograd.Function):
    """``dense``: out[s] = sum_k W_k^T x[nbr[s, k]] over every offset, masked; chunked over kernel offsets."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, neighbours: torch.Tensor, chunk: int) -> torch.Tensor:
        m, c_in = x.shape
        k, _, c_out = weight.shape
        out = x.new_zeros(m, c_out)
        for start in range(0, k, chunk):
            idx = neighbours[:, start:start + chunk]
            valid = (idx >= 0).unsqueeze(-1).to(x.dtype)
            gathered = x[idx.clamp(min=0)] * valid  # (M, kc, C_in)
            out += gathered.reshape(m, -1) @ weight[start:start + chunk].reshape(-1, c_out)
        ctx.save_for_backward(x, weight, neighbours)
        ctx.chunk = chunk
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight, neighbours = ctx.saved_tensors
        chunk = ctx.chunk
        m, c_in = x.shape
        k, _, c_out = weight.shape
        grad_out = grad_out.contiguous()
        grad_x = torch.zeros_like(x) if ctx.needs_input_grad[0] else None
        grad_w = torch.zeros_like(weight) if ctx.needs_input_grad[1] else None
        for start in range(0, k, chunk):
            idx = neighbours[:, start:start + chunk]
            kc = idx.shape[1]
            valid = (idx >= 0).unsqueeze(-1).to(x.dtype)
            safe_idx = idx.clamp(min=0)
            if grad_w is not None:
                gathered = (x[safe_idx] * valid).reshape(m, -1)
                grad_w[start:start + kc] = (gathered.t() @ grad_out).view(kc, c_in, c_out)
            if grad_x is not None:
                back = (grad_out @ weight[start:start + kc].reshape(-1, c_out).t()).view(m, kc, c_in) * valid
                grad_x.index_add_(0, safe_idx.reshape(-1), back.reshape(-1, c_in))
        return grad_x, grad_w, None, None


def _kernel_size_of(weight: torch.Tensor) -> int:
    k = weight.shape[0]
    kernel_size = round(k ** (1 / 3))
    if kernel_size ** 3 != k or kernel_size % 2 == 0:
        raise ValueError(f"weight has {k} kernel offsets; expected an odd cube (e.g. 125 for 5^3)")
    return kernel_size


def build_rulebook(coords: torch.Tensor, batch_index: torch.Tensor, spatial_shape: Sequence[int],
                   kernel_size: int) -> tuple[VoxelNeighbours, Rulebook]:
    """Voxel slots of the points and the rulebook of their k^3 submanifold neighbourhoods (one host sync)."""
    nbrs = VoxelNeighbours(coords, batch_index, spatial_shape, kernel_size, half=True)
    return nbrs, Rulebook(nbrs, kernel_size ** 3)


def submanifold_conv3d(
    features: torch.Tensor,
    coords: torch.Tensor,
    batch_index: torch.Tensor,
    weight: torch.Tensor,
    spatial_shape: Sequence[int],
    chunk_elements: int = 1 << 26,
    impl: str = "rulebook",
) -> torch.Tensor:
    """Submanifold conv of point features (M, C_in) at integer voxel ``coords`` (M, 3) -> (M, C_out).

    ``weight`` is (k^3, C_in, C_out) with offsets in ``kernel_offsets`` order. ``chunk_elements`` bounds
    the gathered block per GEMM. ``impl``: ``rulebook`` (occupied pairs only) or ``dense`` (see module doc).
    """
    if impl not in SPARSE_CONV_IMPLS:
        raise ValueError(f"sparse conv impl={impl!r}; valid choices: {', '.join(SPARSE_CONV_IMPLS)}")
    kernel_size = _kernel_size_of(weight)
    m, c_in = features.shape
    if impl == "rulebook":
        nbrs, book = build_rulebook(coords, batch_index, spatial_shape, kernel_size)
    else:
        nbrs = VoxelNeighbours(coords, batch_index, spatial_shape, kernel_size)
    slot_features = features.new_zeros(m, c_in).index_add_(0, nbrs.slot_of_point, features)
    slot_features = slot_features / nbrs.count.clamp(min=1).unsqueeze(-1).to(features.dtype)
    w = weight.to(features.dtype)
    if impl == "rulebook":
        slot_out = _RulebookConv.apply(slot_features, w, book.in_slots, book.out_slots, book.offset_ids,
                                       book.centre, chunk_elements)
    else:
        k = weight.shape[0]
        chunk = max(1, min(k, chunk_elements // max(1, m * c_in)))
        slot_out = _GatherConv.apply(slot_features, w, nbrs.neighbours, chunk)
    return slot_out[nbrs.slot_of_point]


class GaussianSparseConv(nn.Module):
    """Upstream ``SparseConv3D``: voxelise the Gaussian means on a grid over the scene, apply a bias-free
    submanifold k^3 conv to the instance features, then an optional output linear (``use_out_proj``)."""

    def __init__(
        self,
        embed_dims: int,
        scene_lower: Sequence[float],
        scene_upper: Sequence[float],
        voxel_size: float = 0.5,
        kernel_size: int = 5,
        use_out_proj: bool = False,
        chunk_elements: int = 1 << 26,
        impl: str = "rulebook",
    ) -> None:
        super().__init__()
        if impl not in SPARSE_CONV_IMPLS:
            raise ValueError(f"sparse_conv={impl!r}; valid choices: {', '.join(SPARSE_CONV_IMPLS)}")
        self.scene_lower = tuple(float(v) for v in scene_lower)
        self.voxel_size = float(voxel_size)
        self.spatial_shape = tuple(round((hi - lo) / voxel_size) for lo, hi in zip(scene_lower, scene_upper))
        self.chunk_elements = chunk_elements
        self.impl = impl
        k = kernel_size ** 3
        self.weight = nn.Parameter(torch.empty(k, embed_dims, embed_dims))
        bound = (6.0 / (k * embed_dims + embed_dims)) ** 0.5  # xavier-uniform over (k*C_in, C_out)
        nn.init.uniform_(self.weight, -bound, bound)
        self.output_proj = nn.Linear(embed_dims, embed_dims) if use_out_proj else nn.Identity()

    def voxelise(self, means: torch.Tensor) -> torch.Tensor:
        """Integer voxel coordinates (..., 3) of metric points, clamped into the grid."""
        return voxel_index(means, self.scene_lower, self.voxel_size, self.spatial_shape)

    def forward(self, instance_feature: torch.Tensor, means: torch.Tensor) -> torch.Tensor:
        b, g, c = instance_feature.shape
        coords = self.voxelise(means.detach()).reshape(b * g, 3)
        batch_index = torch.arange(b, device=means.device).repeat_interleave(g)
        out = submanifold_conv3d(instance_feature.reshape(b * g, c), coords, batch_index, self.weight,
                                 self.spatial_shape, self.chunk_elements, self.impl)
        return self.output_proj(out.view(b, g, -1))
