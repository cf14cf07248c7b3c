"""QCNet test size, compiled layers (accel.compile), three batch shapes in a given order, one process: graphs, FX and
AOT cache hits. With JOB set, torch.compiler.config.job_id turns on Dynamo's local PGO (which dims were dynamic, kept in
the Inductor cache dir).

    TORCHINDUCTOR_CACHE_DIR=DIR python pgo_orders.py JOB|none ORDER   # e.g. drivebench-qcnet 2,0,1
"""
import json, sys, time
from types import SimpleNamespace
import torch
job, order = sys.argv[1], [int(i) for i in sys.argv[2].split(",")]
if job != "none":
    torch.compiler.config.job_id = job
from torch._dynamo.utils import counters
from drivebench.accel.compile import apply_compile
from drivebench.models import create_model
from drivebench.models.qcnet import QCNetLoss, make_transform
from drivebench.models.qcnet.random_scenario import random_batch
torch.set_num_threads(1)
torch.manual_seed(0)
net = create_model("qcnet", "test", compile_scope="layers", dropout=0.0)
apply_compile(net, SimpleNamespace(compile=True, compile_mode="default", compile_dynamic=None))
t = make_transform("test")
shapes = [(6, 16), (9, 16), (9, 26)]
batches = [random_batch(t, num_scenes=2, seed=i, num_agents=a, num_polygons=p, extent=60.0) for i, (a, p) in enumerate(shapes)]
crit = QCNetLoss()
t0 = time.time()
for i in order:
    crit(net(batches[i]), batches[i])["loss"].backward()
print(json.dumps({"job": job, "order": order, "s": round(time.time() - t0, 1), "graphs": counters["stats"]["unique_graphs"],
                  "frames": dict(counters["frames"]), "fx": {k: v for k, v in counters["inductor"].items() if "fxgraph" in k},
                  "aot": {k: v for k, v in counters["aot_autograd"].items() if "cache" in k}}))
