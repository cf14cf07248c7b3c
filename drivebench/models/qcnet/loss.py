"""QCNet's training loss: winner-take-all Laplace NLL on both stages + mixture NLL for the mode logits."""

from __future__ import annotations

from typing import Mapping

import torch
import torch.nn.functional as F
from torch import nn


def laplace_nll(loc: torch.Tensor, scale: torch.Tensor, target: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Elementwise ``log(2 b) + |y - mu| / b``.

    ``b`` is floored at ``eps`` in value only (gradient passes straight through), as upstream does
    by clamping a clone under ``no_grad``.
    """
    scale = scale + (scale.clamp_min(eps) - scale).detach()
    return torch.log(2 * scale) + (target - loc).abs() / scale


def mixture_nll(loc: torch.Tensor, scale: torch.Tensor, target: torch.Tensor, logits: torch.Tensor,
                mask: torch.Tensor) -> torch.Tensor:
    """Per-agent NLL of ``target`` under the K-mode Laplace mixture (upstream ``MixtureNLLLoss``).

    ``loc``/``scale`` (N, K, S, D), ``target`` (N, S, D), ``logits`` (N, K), ``mask`` (N, S).
    """
    nll = laplace_nll(loc, scale, target.unsqueeze(1))  # (N, K, S, D)
    nll = (nll * mask[:, None, :, None]).sum(dim=(-2, -1))
    return -torch.logsumexp(F.log_softmax(logits, dim=-1) - nll, dim=-1)


class QCNetLoss(nn.Module):
    """Upstream QCNet's loss on the agents and steps of ``agent_predict_mask``.

    * best mode per agent: smallest sum over valid future steps of the L2 error of the proposal;
    * ``reg_loss_propose`` / ``reg_loss_refine``: Laplace NLL of that mode (summed over x, y),
      averaged over agents per future step, then over steps;
    * ``cls_loss``: mixture NLL of the final-step target under the (detached) refined modes and
      the logits ``pi``, averaged over agents with a valid final step;
    * ``loss``: their sum. Everything is computed in float32 (autocast-safe) without host syncs.
    """

    def __init__(self, output_dim: int = 2) -> None:
        super().__init__()
        self.output_dim = output_dim

    def forward(self, outputs: Mapping[str, torch.Tensor],
                batch: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        d = self.output_dim
        reg_mask = batch["agent_predict_mask"]  # (A, F)
        cls_mask = reg_mask[:, -1]
        weight = reg_mask.float()
        gt = batch["agent_target"][..., :d].float()
        loc_p, scale_p = outputs["loc_propose_pos"][..., :d].float(), outputs["scale_propose_pos"][..., :d].float()
        loc_r, scale_r = outputs["loc_refine_pos"][..., :d].float(), outputs["scale_refine_pos"][..., :d].float()
        pi = outputs["pi"].float()

        l2 = (torch.linalg.vector_norm(loc_p - gt.unsqueeze(1), dim=-1) * weight.unsqueeze(1)).sum(-1)  # (A, K)
        best = l2.argmin(dim=-1)
        pick = best.view(-1, 1, 1, 1).expand(-1, 1, *loc_p.shape[2:])

        def reg_loss(loc: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
            nll = laplace_nll(loc.gather(1, pick).squeeze(1), scale.gather(1, pick).squeeze(1), gt).sum(-1) * weight
            return (nll.sum(0) / weight.sum(0).clamp(min=1)).mean()

        reg_propose = reg_loss(loc_p, scale_p)
        reg_refine = reg_loss(loc_r, scale_r)
        cls = mixture_nll(loc_r[:, :, -1:].detach(), scale_r[:, :, -1:].detach(), gt[:, -1:], pi, weight[:, -1:])
        cls_weight = cls_mask.float()
        cls = (cls * cls_weight).sum() / cls_weight.sum().clamp(min=1)
        return {
            "loss": reg_propose + reg_refine + cls,
            "reg_loss_propose": reg_propose,
            "reg_loss_refine": reg_refine,
            "cls_loss": cls,
        }
