"""Segment (per-destination) softmax and sum over edge lists, in plain PyTorch.

These replace torch_scatter / PyG ``softmax`` + ``MessagePassing(aggr='add')``. They take the
number of destinations from a tensor shape, never from tensor values, so they run without host
syncs and trace under ``torch.compile(dynamic=True)``.
"""

from __future__ import annotations

import torch


def segment_softmax(scores: torch.Tensor, index: torch.Tensor, num_segments: int) -> torch.Tensor:
    """Softmax of ``scores`` (E, H) over the edges that share a destination ``index`` (E,).

    Computed in float32 whatever the input dtype (bf16 exponentials of attention logits are too
    coarse). The per-segment max is detached: softmax is invariant to it, so no gradient is lost.
    """
    scores = scores.float()
    expanded = index.unsqueeze(-1).expand_as(scores)
    seg_max = scores.new_full((num_segments, scores.size(-1)), float("-inf"))
    seg_max = seg_max.scatter_reduce(0, expanded, scores, reduce="amax", include_self=True).detach()
    exp = (scores - seg_max.index_select(0, index)).exp()
    denom = exp.new_zeros((num_segments, scores.size(-1))).index_add(0, index, exp)
    return exp / (denom.index_select(0, index) + 1e-16)


def segment_sum(values: torch.Tensor, index: torch.Tensor, num_segments: int) -> torch.Tensor:
    """Sum rows of ``values`` (E, ...) into ``num_segments`` rows by ``index``; empty segments are 0."""
    out = values.new_zeros((num_segments, *values.shape[1:]))
    return out.index_add(0, index, values)
