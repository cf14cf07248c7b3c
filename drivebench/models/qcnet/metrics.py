"""Motion-forecasting metrics at K guesses (minADE, minFDE, MR, Brier, brier-minFDE) and a
constant-velocity baseline, following upstream QCNet's validation (``metrics/*.py``).

Conventions (as upstream): an agent counts if it has any valid future step; FDE is taken at its
last valid step; the best mode is the one with the smallest FDE, and minADE is that mode's ADE over
the valid steps; a miss is minFDE > 2 m; upstream's ``Brier`` is ``(1 - p_best)^2``, and the
Argoverse 2 ranking metric brier-minFDE is ``minFDE + (1 - p_best)^2``. With more than K modes the
K most probable are kept and their probabilities renormalised.

Everything works on tensors with masks (no boolean indexing), so updates do not sync the host;
:meth:`MotionMetrics.compute` is the one place that reads values back.
"""

from __future__ import annotations

from typing import Any

import torch
from torchmetrics import Metric

from drivebench.models.qcnet.vocab import STEP_SECONDS


def top_k_modes(pred: torch.Tensor, prob: torch.Tensor | None, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep the ``k`` most probable modes of ``pred`` (N, M, T, 2); return them and renormalised probabilities."""
    num_modes = pred.size(1)
    if prob is None:
        prob = pred.new_full(pred.shape[:2], 1.0 / num_modes)
    if num_modes > k:
        idx = prob.topk(k, dim=-1).indices
        pred = pred.gather(1, idx[:, :, None, None].expand(-1, -1, *pred.shape[2:]))
        prob = prob.gather(1, idx)
    return pred, prob / prob.sum(-1, keepdim=True)


def per_agent_metrics(pred: torch.Tensor, target: torch.Tensor, valid: torch.Tensor, prob: torch.Tensor | None = None,
                      k: int = 6, miss_threshold: float = 2.0) -> dict[str, torch.Tensor]:
    """Per-agent minADE, minFDE, miss, brier and brier-minFDE (N,) plus ``counted`` (agents with a valid step).

    ``pred`` (N, M, T, 2), ``target`` (N, T, 2), ``valid`` (N, T) bool, ``prob`` (N, M) probabilities or None.
    """
    pred, prob = top_k_modes(pred.float(), None if prob is None else prob.float(), k)
    target = target.float()
    weight = valid.float()
    steps = torch.arange(1, valid.size(-1) + 1, device=valid.device)
    last = (weight * steps).argmax(-1)  # last valid step (0 when none)
    rows = torch.arange(pred.size(0), device=pred.device)
    err = torch.linalg.vector_norm(pred - target.unsqueeze(1), dim=-1)  # (N, K, T)
    fde = err[rows, :, last]  # (N, K)
    min_fde, best = fde.min(-1)
    ade = (err[rows, best] * weight).sum(-1) / weight.sum(-1).clamp(min=1)
    brier = (1.0 - prob[rows, best]).pow(2)
    return {
        "minADE": ade,
        "minFDE": min_fde,
        "MR": (min_fde > miss_threshold).float(),
        "brier": brier,
        "brier_minFDE": min_fde + brier,
        "counted": valid.any(-1),
    }


def constant_velocity_forecast(velocity: torch.Tensor, heading: torch.Tensor, num_steps: int,
                               step_seconds: float = STEP_SECONDS) -> torch.Tensor:
    """Extrapolate each agent's last observed velocity (N, 2), in the agent frame of ``heading`` (N,).

    Returns (N, num_steps, 2): positions relative to the current position, rotated like QCNet's targets.
    """
    cos, sin = heading.cos(), heading.sin()
    v_local = torch.stack([velocity[:, 0] * cos + velocity[:, 1] * sin,
                           -velocity[:, 0] * sin + velocity[:, 1] * cos], dim=-1)
    t = torch.arange(1, num_steps + 1, device=velocity.device, dtype=v_local.dtype) * step_seconds
    return v_local.unsqueeze(1) * t[:, None]


class MotionMetrics(Metric):
    """Accumulates :func:`per_agent_metrics` over batches for the agents selected by ``agent_mask``.

    A torchmetrics ``Metric``: per-metric sums and the agent count are ``sum`` states, so under DDP
    ``compute`` gives means over every rank's agents (each agent weighs once, whichever rank saw it).
    """

    names = ("minADE", "minFDE", "MR", "brier", "brier_minFDE")
    full_state_update = False

    def __init__(self, k: int = 6, miss_threshold: float = 2.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.k = k
        self.miss_threshold = miss_threshold
        self.add_state("sums", default=torch.zeros(len(self.names)), dist_reduce_fx="sum", persistent=False)
        self.add_state("agents", default=torch.zeros(()), dist_reduce_fx="sum", persistent=False)

    def update(self, pred: torch.Tensor, target: torch.Tensor, valid: torch.Tensor, prob: torch.Tensor | None = None,
               agent_mask: torch.Tensor | None = None) -> None:
        values = per_agent_metrics(pred, target, valid, prob, self.k, self.miss_threshold)
        weight = values["counted"].float()
        if agent_mask is not None:
            weight = weight * agent_mask.float()
        self.sums += torch.stack([(values[name] * weight).sum() for name in self.names])
        self.agents += weight.sum()

    def compute(self) -> dict[str, float]:
        """Means over the counted agents (reads back to the host); empty dict before any agent."""
        count = float(self.agents)
        if count == 0:
            return {}
        return {name: float(value) / count for name, value in zip(self.names, self.sums.tolist())}

    @property
    def count(self) -> float:
        return float(self.agents)
