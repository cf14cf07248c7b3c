"""Instance bank: the learned anchors of a sparse head plus the temporal instances it streams.

Streaming state (why it exists): Sparse4D / SparseDrive train on consecutive frames of a sequence
per batch slot (``drivebench.data.streaming.SequenceGroupedBatchSampler``). After each step the
bank keeps the ``num_temp`` most confident instances of every slot (features and anchors,
detached); at the next step they are moved into the new frame and replace the lowest-ranked fresh
queries after the first (single-frame) decoder layer.

State rules, all per batch slot:
- the state lives in plain attributes (not buffers), so it is not part of ``state_dict``: resuming
  from a checkpoint starts with an empty bank (the first step after resume behaves like the first
  frame of a sequence);
- everything cached is detached: no gradient crosses a training step;
- a slot whose ``valid`` flag is False (``prev_exists`` False, or the frames more than
  ``max_time_interval`` apart) uses fresh queries only and its carried confidence and track ids are
  dropped;
- a change of batch size (last short batch, validation) drops the state.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import torch
from torch import nn


@dataclass
class TemporalContext:
    """How the current batch relates to the previous one, per slot (computed once by the model)."""

    has_history: bool  # the model holds state for this batch size (Python flag, not a tensor)
    valid: torch.Tensor  # (B,) bool: the slot continues the previous frame
    prev2cur: torch.Tensor  # (B, 4, 4) previous lidar frame -> current lidar frame (identity if none)
    dt: torch.Tensor  # (B,) seconds since the previous frame (0 if none)
    time_interval: torch.Tensor  # (B,) dt where valid and non-zero, else the default 0.5 s


@dataclass
class BankState:
    feature: torch.Tensor  # (B, T, C)
    anchor: torch.Tensor  # (B, T, D)
    confidence: torch.Tensor  # (B, T) sigmoid confidence, decayed over time
    instance_id: torch.Tensor | None  # (B, num_anchor) track ids of the cached instances (first T), -1 after


def topk_gather(score: torch.Tensor, k: int, *tensors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """Top-k along dim 1 of ``score`` (B, N); returns (values, indices, gathered tensors (B, k, ...))."""
    values, idx = torch.topk(score, k, dim=1)
    out = []
    for t in tensors:
        index = idx.view(*idx.shape, *([1] * (t.dim() - 2))).expand(-1, -1, *t.shape[2:])
        out.append(torch.gather(t, 1, index))
    return values, idx, out


class InstanceBank(nn.Module):
    """Learned anchors and instance features, plus the temporal cache (see module docstring)."""

    def __init__(
        self,
        anchors: torch.Tensor,
        dims: int,
        num_temp: int,
        project: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
        confidence_decay: float = 0.6,
        feat_grad: bool = True,
        anchor_grad: bool = True,
        track_ids: bool = False,
    ) -> None:
        super().__init__()
        if num_temp > anchors.shape[0]:
            raise ValueError(f"num_temp={num_temp} exceeds the {anchors.shape[0]} anchors of the bank")
        self.num_anchor = anchors.shape[0]
        self.num_temp = num_temp
        self.confidence_decay = confidence_decay
        self.project = project
        self.track_ids = track_ids
        self.anchor = nn.Parameter(anchors.float().clone(), requires_grad=anchor_grad)
        feature = torch.zeros(self.num_anchor, dims)
        if feat_grad:
            nn.init.xavier_uniform_(feature)
        self.instance_feature = nn.Parameter(feature, requires_grad=feat_grad)
        self.state: BankState | None = None
        self.next_id: torch.Tensor | None = None

    # ---- state ---------------------------------------------------------------------------
    def reset_state(self) -> None:
        self.state = None
        self.next_id = None

    def get(self, batch_size: int, ctx: TemporalContext) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Fresh (B, Q, C) features and (B, Q, D) anchors, plus the cached instances moved into this frame."""
        # copies, not views of the parameters: a compiled unit (the dfa units of compile_scope=aggregation) guards on
        # strides (a stride-0 view cost a second graph per unit) and on requires_grad (at batch 1 ``contiguous()``
        # keeps the view, which under no_grad still requires grad where the refined anchors do not)
        feature = self.instance_feature[None].expand(batch_size, -1, -1).clone(memory_format=torch.contiguous_format)
        anchor = self.anchor[None].expand(batch_size, -1, -1).clone(memory_format=torch.contiguous_format)
        state = self.state
        if state is None or not ctx.has_history or state.feature.shape[0] != batch_size:
            self.state = None
            return feature, anchor, None, None
        temp_anchor = self.project(state.anchor, ctx.prev2cur, ctx.dt)
        return feature, anchor, state.feature, temp_anchor

    def update(self, feature: torch.Tensor, anchor: torch.Tensor, cls_logits: torch.Tensor,
               temp_feature: torch.Tensor | None, temp_anchor: torch.Tensor | None,
               valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """After the single-frame layers: cached instances + the best fresh ones replace the queries
        of valid slots (invalid slots keep their fresh queries)."""
        if temp_feature is None or temp_anchor is None or self.state is None:
            return feature, anchor
        n_fresh = self.num_anchor - self.num_temp
        _, _, (sel_feat, sel_anchor) = topk_gather(cls_logits.max(dim=-1).values, n_fresh, feature, anchor)
        merged_feat = torch.cat([temp_feature, sel_feat], dim=1)
        merged_anchor = torch.cat([temp_anchor, sel_anchor], dim=1)
        v = valid[:, None, None]
        state = self.state  # replaced, never mutated: snapshots (``streaming_state``) stay intact
        instance_id = state.instance_id
        if instance_id is not None:
            instance_id = torch.where(valid[:, None], instance_id, torch.full_like(instance_id, -1))
        self.state = replace(state, confidence=torch.where(valid[:, None], state.confidence, torch.zeros_like(state.confidence)),
                             instance_id=instance_id)
        return torch.where(v, merged_feat, feature), torch.where(v, merged_anchor, anchor)

    def cache(self, feature: torch.Tensor, anchor: torch.Tensor, cls_logits: torch.Tensor) -> torch.Tensor | None:
        """Keep the ``num_temp`` most confident instances (detached) for the next step.

        Returns the (B, Q) track ids of the current instances when ``track_ids`` is on, else None.
        """
        confidence = cls_logits.detach().max(dim=-1).values.sigmoid()
        prev = self.state
        if prev is not None and self.num_temp > 0:
            carried = torch.maximum(prev.confidence * self.confidence_decay, confidence[:, : self.num_temp])
            confidence = torch.cat([carried, confidence[:, self.num_temp :]], dim=1)
        ids = self._assign_ids(confidence, prev) if self.track_ids else None
        if self.num_temp <= 0:
            self.state = None
            return ids
        conf, idx, (feat, anc) = topk_gather(confidence, self.num_temp, feature.detach(), anchor.detach())
        cached_ids = None
        if ids is not None:
            cached_ids = torch.full_like(ids, -1)
            cached_ids[:, : self.num_temp] = torch.gather(ids, 1, idx)
        self.state = BankState(feat, anc, conf, cached_ids)
        return ids

    def _assign_ids(self, confidence: torch.Tensor, prev: BankState | None) -> torch.Tensor:
        """Track ids: cached instances keep theirs, every other query gets a new one.

        Counts on the device (cumsum), so no host sync; ids are unique within the bank's lifetime.
        """
        b, q = confidence.shape
        ids = torch.full((b, q), -1, dtype=torch.long, device=confidence.device)
        if prev is not None and prev.instance_id is not None and prev.instance_id.shape[0] == b:
            ids[:, : self.num_temp] = prev.instance_id[:, : self.num_temp]
        if self.next_id is None:
            self.next_id = torch.zeros((), dtype=torch.long, device=confidence.device)
        new = (ids < 0).flatten()
        numbering = torch.cumsum(new.long(), 0) - 1 + self.next_id
        ids = torch.where(new, numbering, ids.flatten()).view(b, q)
        self.next_id = self.next_id + new.sum()
        return ids
