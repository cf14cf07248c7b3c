"""Does torch's local PGO (accel.compile_shape_profile) find a compiled module's frames again in a later process on
this machine's torch? Two processes per kind of unit, the first at batch sizes 4 then 6, the second at 5 then 7:
graphs in the second = 1 where the profile made the batch dimension dynamic at its first call, 2 where it was not
found. Units: one of QCNet's (a drivebench class, as accel.compile compiles it) and an nn.Sequential (torch 2.14
with Python 3.11 keys the frame around a torch-defined forward by a closure hash that changes between processes:
never found). One JSON line per kind.

    python scripts/device/pgo_frames.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

CHILD = """
import json, sys, torch
from drivebench.accel.compile import use_shape_profile
from drivebench.models.qcnet.layers import FourierEmbedding
from torch._dynamo.utils import counters
use_shape_profile("drivebench-pgo-frames")
if sys.argv[1] == "qcnet_unit":
    unit, width = FourierEmbedding(input_dim=2, hidden_dim=16, num_freq_bands=4), 2
else:
    unit, width = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 1)), 8
unit.compile(backend="eager")
for n in [int(s) for s in sys.argv[2].split(",")]:
    unit(torch.randn(n, width))
print(int(counters["stats"]["unique_graphs"]))
"""


def main() -> None:
    import torch

    for way in ("qcnet_unit", "sequential"):
        with tempfile.TemporaryDirectory() as cache:
            env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
            graphs = []
            for sizes in ("4,6", "5,7"):
                run = subprocess.run([sys.executable, "-c", CHILD, way, sizes], env=env, capture_output=True,
                                     text=True, timeout=300)
                graphs.append(int(run.stdout.split()[-1]) if run.returncode == 0 else run.stderr[-300:])
        print(json.dumps({"way": way, "torch": torch.__version__, "python": sys.version.split()[0],
                          "graphs_first_then_second_process": graphs}), flush=True)


if __name__ == "__main__":
    main()
