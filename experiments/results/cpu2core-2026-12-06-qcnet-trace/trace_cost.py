"""Where QCNet's warm compile goes: Dynamo's tracing alone (backend=eager) and with AOTAutograd (aot_eager)."""
import sys, time, torch
from drivebench.models import create_model
from drivebench.models.qcnet import QCNetLoss, make_transform
from drivebench.models.qcnet.random_scenario import random_batch
torch.set_num_threads(1)
backend = sys.argv[1]
torch.manual_seed(0)
net = create_model("qcnet", "paper", compile_scope="layers")
batch = random_batch(make_transform("paper"), num_scenes=4, num_agents=30, num_polygons=80, extent=100.0)
loss_fn = QCNetLoss()
def step():
    out = net(batch); loss = loss_fn(out, batch)["loss"]; loss.backward()
t = time.perf_counter(); step(); eager = time.perf_counter() - t
t = time.perf_counter(); step(); eager2 = time.perf_counter() - t
units = net.compile_units()
for m in units.values():
    m.compile(backend=backend)
import torch._dynamo.utils as du
t = time.perf_counter(); step(); first = time.perf_counter() - t
t = time.perf_counter(); step(); second = time.perf_counter() - t
print(f"{backend}: units {len(units)}, eager step {eager:.2f}/{eager2:.2f} s, first compiled step {first:.2f} s, second {second:.2f} s")
print({k: round(sum(v), 2) for k, v in du.compilation_time_metrics.items() if k in ("_compile.compile_inner", "bytecode_tracing", "build_guards")})
