"""MapTR's NMS-free decoding (upstream ``MapTRNMSFreeCoder``): the top-k (query, class) pairs by
sigmoid score become the predicted map elements; a query may appear under several classes."""

from __future__ import annotations

import torch


def decode_top_k(cls_logits: torch.Tensor, pts: torch.Tensor, k: int) -> dict[str, torch.Tensor]:
    """
    Args:
        cls_logits: (B, V, C) last-layer logits; pts: (B, V, P, 2) points in metres.
        k: elements kept per sample (50 upstream; capped at V * C).

    Returns:
        scores (B, k), labels (B, k) long, pts (B, k, P, 2).
    """
    b, v, c = cls_logits.shape
    k = min(k, v * c)
    scores, flat = cls_logits.sigmoid().reshape(b, v * c).topk(k, dim=1)
    labels = flat % c
    query = flat // c
    picked = torch.gather(pts, 1, query[:, :, None, None].expand(b, k, *pts.shape[2:]))
    return {"scores": scores, "labels": labels, "pts": picked}
