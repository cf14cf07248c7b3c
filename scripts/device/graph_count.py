"""How many graphs Dynamo makes of QCNet's compile units under bf16 autocast, with the attention layers' input
dtype as it comes and cast to float32 at the layer's entry; and whether that cast changes any number.

    python scripts/device/graph_count.py [cuda|cpu]

backend="eager" (Dynamo's tracing only, no Inductor): the count is what a warm start loads from the cache.
"""
from __future__ import annotations

import json
import sys
import time

import torch
import torch._dynamo
import torch._dynamo.utils as dynamo_utils
from lightning.pytorch.utilities import move_data_to_device

from drivebench.models import create_model
from drivebench.models.qcnet import QCNetLoss, make_transform
from drivebench.models.qcnet.layers import AttentionLayer
from drivebench.models.qcnet.random_scenario import random_batch

DEVICE = sys.argv[1] if len(sys.argv) > 1 else "cuda"
SIZE = "paper" if DEVICE == "cuda" else "test"
ORIGINAL = AttentionLayer.forward


def float_entry(self, x, r, edge_index, group_size=1):
    x = tuple(t.float() for t in x) if isinstance(x, tuple) else x.float()
    return ORIGINAL(self, x, r, edge_index, group_size)


def count(variant: str) -> dict:
    AttentionLayer.forward = float_entry if variant == "float entry" else ORIGINAL
    torch._dynamo.reset()
    dynamo_utils.counters.clear()
    torch.manual_seed(0)
    net = create_model("qcnet", SIZE, compile_scope="layers").to(DEVICE)
    for unit in net.compile_units().values():
        unit.compile(backend="eager")
    loss_fn = QCNetLoss()
    transform = make_transform(SIZE)
    t0 = time.perf_counter()
    for agents, polygons in ((30, 80), (36, 96)):
        scene = random_batch(transform, num_scenes=4, num_agents=agents, num_polygons=polygons, extent=100.0)
        batch = move_data_to_device(scene, DEVICE)
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            loss = loss_fn(net(batch), batch)["loss"]
        loss.backward()
    return {"variant": variant, "graphs": dynamo_utils.counters["stats"]["unique_graphs"],
            "frames": dict(dynamo_utils.counters["frames"]), "seconds": round(time.perf_counter() - t0, 1)}


def identity() -> dict:
    """One attention layer, eval mode (no dropout): a bf16 input against its float32 copy, under autocast."""
    torch.manual_seed(0)
    layer = AttentionLayer(128, 8, 16, 0.1, bipartite=False, has_pos_emb=True).to(DEVICE).eval()
    x = torch.randn(200, 128, device=DEVICE).to(torch.bfloat16)
    r = torch.randn(1000, 128, device=DEVICE).to(torch.bfloat16)
    edges = torch.randint(0, 200, (2, 1000), device=DEVICE)
    AttentionLayer.forward = ORIGINAL
    with torch.no_grad(), torch.autocast(DEVICE, dtype=torch.bfloat16):
        as_given, as_float = layer(x, r, edges), layer(x.float(), r, edges)
    return {"identity_max_abs_diff": float((as_given.float() - as_float.float()).abs().max()),
            "dtypes": [str(as_given.dtype), str(as_float.dtype)]}


if __name__ == "__main__":
    for result in (identity(), count("as given"), count("float entry")):
        print(json.dumps(result), flush=True)
