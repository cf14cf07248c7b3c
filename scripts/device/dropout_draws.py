"""Dropout's noise in one QCNet attention layer (paper size, p=0.1): eager, compiled, compiled inside a CUDA graph.

    python scripts/device/dropout_draws.py

Per variant, 40 forward passes of one input: the spread over draws of a fixed projection of the output (dropout's
noise; 0 if dropout did nothing) and the correlation of consecutive draws' deviations (0 if each draw's masks are new).
"""
import json

import torch

from drivebench.accel.cuda_graphs import GraphedLoss
from drivebench.models.qcnet.layers import AttentionLayer

torch.manual_seed(0)
layer = AttentionLayer(128, 8, 16, 0.1, bipartite=False, has_pos_emb=True).cuda().train()
x, r = torch.randn(500, 128, device="cuda"), torch.randn(4000, 128, device="cuda")
edges = torch.randint(0, 500, (2, 4000), device="cuda")
w = torch.randn(500, 128, device="cuda")
compiled = torch.compile(layer)
graphed = GraphedLoss(layer, lambda b: {"loss": (compiled(b["x"], b["r"], b["e"]) * b["w"]).sum()})


def stats(name, draw):
    values = torch.tensor([float(draw()) for _ in range(40)])
    dev = values - values.mean()
    corr = float((dev[1:] * dev[:-1]).mean() / dev.var())
    print(json.dumps({"variant": name, "mean": round(float(values.mean()), 3), "std": round(float(values.std()), 3),
                      "lag1_corr": round(corr, 3)}), flush=True)


with torch.no_grad():
    stats("eager", lambda: (layer(x, r, edges) * w).sum())
    stats("compiled", lambda: (compiled(x, r, edges) * w).sum())
stats("compiled in a CUDA graph", lambda: graphed({"x": x, "r": r, "e": edges, "w": w})["loss"].detach())
layer.eval()
with torch.no_grad():
    stats("eval (no dropout)", lambda: (layer(x, r, edges) * w).sum())
