"""Pad a QCNet batch to one of a few fixed shapes, so that a captured CUDA graph can replay it.

Why: a CUDA graph replays kernels with the shapes it was captured with, while every QCNet batch
has its own numbers of agents, polygons, points and edges. Padding each count up to a *bucket*
turns the stream of batches into a handful of shapes, one captured graph each.

Buckets are chosen online (:class:`ShapeBuckets`): a batch takes the smallest bucket in use that
holds it; a batch that fits none opens a new bucket ``growth`` times its own counts (rounded up),
and once ``max_buckets`` are open the next one covers every bucket so far, so the set stays
small. On the embedded bench set (batch 4, 3 epochs simulated) growth 1.15 and ``max_buckets=4``
open 6 buckets, all within the first 120 batches, and pad about 22% more rows than the batches hold.

Padding never changes the loss or any real node's output:

* padded agents have no valid history step, no step to predict and category 0 (not focal), so the
  loss gives them zero weight and the metrics never select them;
* padded polygons and points carry type 0 and zeros;
* every padded edge joins the *sink* (the last node of its source space) to the sink of its
  destination space; the sinks are padded nodes, so every real node's segment softmax and sum
  see exactly the edges they saw before.

What differs: dropout draws its masks over the padded tensors (a different but equally likely
mask for the real rows) and sums run over more (zero) terms in a different order, so a padded
step matches an unpadded one to rounding (tested within 1e-5 with dropout off).
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import torch

from drivebench.models.qcnet.batch import EDGE_ATTR_KEYS, EDGE_NODE_SPACES, NODE_KEYS

NODE_SPACES = ("agent", "polygon", "point")
EDGE_KEYS = tuple(EDGE_NODE_SPACES)


def batch_counts(batch: Mapping[str, Any]) -> dict[str, int]:
    """Rows per node space and per edge list of a ``collate_qcnet`` batch (read from shapes: no sync)."""
    counts = {space: int(batch[NODE_KEYS[space][0]].shape[0]) for space in NODE_SPACES}
    counts.update({key: int(batch[key].shape[1]) for key in EDGE_KEYS})
    return counts


def _round_up(value: float, multiple: int) -> int:
    return int(math.ceil(value / multiple) * multiple)


class ShapeBuckets:
    """The padded shapes in use, chosen online so that few of them exist.

    Args:
        growth: a new bucket is this factor above the batch that opened it (>= 1).
        max_buckets: after this many, a new bucket covers all earlier ones and the batch.
        multiple: every capacity is rounded up to a multiple of this.
    """

    def __init__(self, growth: float = 1.15, max_buckets: int = 4, multiple: int = 64) -> None:
        if growth < 1.0:
            raise ValueError(f"growth must be >= 1, got {growth}")
        if max_buckets < 1:
            raise ValueError(f"max_buckets must be >= 1, got {max_buckets}")
        self.growth = growth
        self.max_buckets = max_buckets
        self.multiple = multiple
        self.buckets: list[dict[str, int]] = []

    @staticmethod
    def needed(counts: Mapping[str, int]) -> dict[str, int]:
        """Capacities a batch needs: one padded node per node space for the sinks."""
        return {key: count + 1 if key in NODE_SPACES else count for key, count in counts.items()}

    def choose(self, counts: Mapping[str, int]) -> dict[str, int]:
        """The bucket for a batch with ``counts`` (opening one if none holds it)."""
        need = self.needed(counts)
        fits = [b for b in self.buckets if all(b[k] >= v for k, v in need.items())]
        if fits:
            return min(fits, key=lambda b: sum(b.values()))
        base = dict(need)
        if len(self.buckets) >= self.max_buckets:
            base = {k: max([v, *(b[k] for b in self.buckets)]) for k, v in need.items()}
        bucket = {k: _round_up(max(v, 1) * self.growth, self.multiple) for k, v in base.items()}
        self.buckets.append(bucket)
        return bucket


def _pad_rows(tensor: torch.Tensor, rows: int, value: float | bool | int = 0) -> torch.Tensor:
    extra = rows - tensor.shape[0]
    if extra < 0:
        raise ValueError(f"cannot pad {tuple(tensor.shape)} down to {rows} rows")
    if extra == 0:
        return tensor
    filler = tensor.new_full((extra, *tensor.shape[1:]), value)
    return torch.cat([tensor, filler], dim=0)


def pad_batch(batch: Mapping[str, Any], capacity: Mapping[str, int], num_historical_steps: int,
              num_modes: int) -> dict[str, Any]:
    """``batch`` with every node and edge tensor padded to ``capacity`` (see the module docstring).

    Keys other than node/edge tensors (``num_graphs``, ids, ``av_index``, counts) pass through, so
    throughput and metrics still count the real scenes.
    """
    counts = batch_counts(batch)
    if any(capacity[k] < v for k, v in ShapeBuckets.needed(counts).items()):
        raise ValueError(f"batch {counts} does not fit bucket {dict(capacity)}")
    out = dict(batch)
    num_graphs = int(batch["num_graphs"])
    for space in NODE_SPACES:
        rows = capacity[space]
        for key in NODE_KEYS[space]:
            out[key] = _pad_rows(batch[key], rows, False if batch[key].dtype == torch.bool else 0)
        if f"{space}_batch" in batch:
            out[f"{space}_batch"] = _pad_rows(batch[f"{space}_batch"], rows, num_graphs)
    agents = capacity["agent"]
    sinks = {
        "agent": agents - 1,
        "agent_step": agents * num_historical_steps - 1,
        "mode": agents * num_modes - 1,
        "polygon": capacity["polygon"] - 1,
        "point": capacity["point"] - 1,
    }
    for key, (src_space, dst_space) in EDGE_NODE_SPACES.items():
        edges = batch[key]
        extra = capacity[key] - edges.shape[1]
        if extra:
            sink = torch.stack([edges.new_full((extra,), sinks[src_space]), edges.new_full((extra,), sinks[dst_space])])
            out[key] = torch.cat([edges, sink], dim=1)
    for attr_key, edge_key in EDGE_ATTR_KEYS.items():
        out[attr_key] = _pad_rows(batch[attr_key], capacity[edge_key], 0)
    return out


class StaticShapePadder:
    """Callable batch -> padded batch with its own :class:`ShapeBuckets` (one per training run)."""

    def __init__(self, num_historical_steps: int, num_modes: int, buckets: ShapeBuckets | None = None) -> None:
        self.num_historical_steps = num_historical_steps
        self.num_modes = num_modes
        self.buckets = buckets or ShapeBuckets()
        self.real_rows = 0
        self.padded_rows = 0

    def __call__(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        counts = batch_counts(batch)
        capacity = self.buckets.choose(counts)
        self.real_rows += sum(counts.values())
        self.padded_rows += sum(capacity.values())
        return pad_batch(batch, capacity, self.num_historical_steps, self.num_modes)

    def describe(self) -> dict[str, Any]:
        """For the summary: how many shapes, and how much larger the padded batches were."""
        return {
            "buckets": len(self.buckets.buckets),
            "growth": self.buckets.growth,
            "max_buckets": self.buckets.max_buckets,
            "padded_over_real_rows": self.padded_rows / self.real_rows if self.real_rows else None,
            "shapes": [dict(b) for b in self.buckets.buckets],
        }
