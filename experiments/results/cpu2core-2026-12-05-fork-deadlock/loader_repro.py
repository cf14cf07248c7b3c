"""The same as repro.py through drivebench's rule: inside a gloo process group (world size 1), with the helper
thread churning thread states, start a one-worker DataLoader N times, its context from
drivebench.start_method.worker_context() (forkserver on a Python with gh-112275) or plain fork, and count the
loaders whose first batch does not come within DataLoader's 5 s timeout (a worker that deadlocked at start).

    python loader_repro.py drivebench 300
    python loader_repro.py fork 300
"""
import multiprocessing as mp
import sys
import tempfile
import threading
import time

import torch.distributed as dist
from torch.utils.data import DataLoader

import repro
from drivebench.start_method import worker_context

if __name__ == "__main__":
    which, n = sys.argv[1], int(sys.argv[2])
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0, world_size=1)
        ctx = worker_context() if which == "drivebench" else mp.get_context(which)
        threading.Thread(target=repro.churn, daemon=True).start()
        hung, t0 = 0, time.time()
        for _ in range(n):
            try:
                next(iter(DataLoader(range(4), batch_size=2, num_workers=1, multiprocessing_context=ctx, timeout=5)))
            except RuntimeError as err:  # "DataLoader timed out after 5 seconds"
                assert "timed out" in str(err), err
                hung += 1
        repro.running = False
        dist.destroy_process_group()
    print(f"python {sys.version.split()[0]} {which} ({ctx.get_start_method()}): {hung} of {n} loaders got no batch "
          f"({time.time() - t0:.1f} s)")
