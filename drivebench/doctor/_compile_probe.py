"""Child probe: torch.compile a tiny module on one device, run it, compare with eager.

Run by the doctor as ``python -m drivebench.doctor._compile_probe --device cpu`` (or cuda) under a
deadline, with inductor's caches disabled so the compiler really runs (a warm cache would hide a
missing C++ compiler or a broken Triton); prints one record with the compile time, or the exception.
On the CPU only the forward pass is compiled: it exercises the same C++ toolchain as the backward
at a third of the cost, which matters on small machines.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

from drivebench.doctor.probe import emit


def tiny_net() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--backward", action="store_true", help="compile and run the backward pass too")
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)
    net = tiny_net().to(device)
    x = torch.randn(8, 16, device=device)
    record: dict[str, object] = {"device": args.device, "torch": torch.__version__, "backward": args.backward}
    try:
        import triton  # inductor's GPU code generator; its version must match torch's

        record["triton"] = triton.__version__
    except Exception:
        record["triton"] = None
    with torch.no_grad():
        eager = net(x)
    compiled = torch.compile(net)
    try:
        started = time.perf_counter()
        if args.backward:
            out = compiled(x)
            out.sum().backward()
        else:
            with torch.no_grad():
                out = compiled(x)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        record["compile_s"] = time.perf_counter() - started
        started = time.perf_counter()
        with torch.no_grad():
            compiled(x)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        record["second_call_s"] = time.perf_counter() - started
        record["max_abs_diff"] = float((out.detach() - eager).abs().max())
        record["ok"] = True
    except Exception as err:
        record["ok"] = False
        record["error"] = f"{type(err).__name__}: {str(err).strip()[:1500]}"
    emit(record)


if __name__ == "__main__":
    main()
