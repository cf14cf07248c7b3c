"""Where QCNet's GPU time goes (paper size, batch 4 of realistic random scenes, bf16 autocast), and
how the segment reductions behind its attention compare with alternatives at its sizes.

Run on the GPU machine: ``python3 scripts/device/qcnet_ops.py`` (prints tables; ~1 minute).
1. torch.profiler over 3 eager training steps: top operators by self CUDA time, kernels per step,
   summed kernel time per step.
2. The same steps replayed as CUDA graphs (accel.cuda_graphs' path): step time by CUDA events.
3. Micro-benchmarks at the pl2a edge set's size: index_add / scatter_reduce (atomics, today) against
   sorted-segment reductions (torch.segment_reduce over CSR lengths).
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from drivebench.accel.cuda_graphs import GraphedLoss
from drivebench.models import create_model
from drivebench.models.qcnet import QCNetLoss, make_transform
from drivebench.models.qcnet.random_scenario import random_batch
from drivebench.models.qcnet.static_shapes import ShapeBuckets, StaticShapePadder


def timed(fn, reps: int = 20, warm: int = 3) -> tuple[float, float, float]:
    for _ in range(warm):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return statistics.median(times), times[len(times) // 10], times[-1 - len(times) // 10]


def main() -> None:
    dev = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.manual_seed(0)
    net = create_model("qcnet", "paper").to(dev)
    crit = QCNetLoss()
    opt = torch.optim.AdamW(net.parameters(), lr=5e-4, weight_decay=1e-4)
    host = random_batch(make_transform("paper"), num_scenes=4, seed=0)
    batch = {k: v.to(dev) if isinstance(v, torch.Tensor) else v for k, v in host.items()}
    print({k: tuple(v.shape) for k, v in batch.items() if k.startswith("edge_")})

    def loss_of(b):
        return crit(net(b), b)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_of(batch)["loss"]
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    med, p10, p90 = timed(step, reps=10)
    print(f"eager step (bf16) {med:.1f} ms [{p10:.1f}, {p90:.1f}]  (CUDA events around the whole step)")
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            step()
        torch.cuda.synchronize()
    events = prof.key_averages()
    print(events.table(sort_by="self_cuda_time_total", row_limit=35, max_name_column_width=60))
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    total_us = sum(e.self_device_time_total if hasattr(e, "self_device_time_total") else e.self_cuda_time_total
                   for e in kernels)
    print(f"kernels per step {len(kernels) / 3:.0f}; summed kernel time per step {total_us / 3 / 1e3:.1f} ms")
    sys.stdout.flush()

    padder = StaticShapePadder(50, 6, ShapeBuckets(growth=1.15))
    graphed = GraphedLoss(net, loss_of)

    def graphed_step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = graphed(padder(batch))["loss"]
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    med, p10, p90 = timed(graphed_step, reps=10)
    print(f"graphed step (bf16, padded {padder.describe()['padded_over_real_rows']:.2f}x rows) {med:.1f} ms "
          f"[{p10:.1f}, {p90:.1f}]")

    # ---- segment reductions at the pl2a size --------------------------------------------------
    dst = batch["edge_pl2a"][1]
    src = batch["edge_pl2a"][0]
    num_dst = batch["agent_position"].shape[0] * 50
    num_src = batch["polygon_position"].shape[0]
    E = dst.numel()
    print(f"pl2a: E={E}, dst nodes {num_dst}, src nodes {num_src}, dst sorted: {bool((dst[1:] >= dst[:-1]).all())}")
    for width, dtype in ((128, torch.float32), (8, torch.float32), (128, torch.bfloat16)):
        vals = torch.randn(E, width, device=dev, dtype=dtype)
        lengths = torch.bincount(dst, minlength=num_dst)
        res = {
            "index_add by dst": lambda: vals.new_zeros(num_dst, width).index_add(0, dst, vals),
            "segment_reduce sum (sorted dst)": lambda: torch.segment_reduce(vals, "sum", lengths=lengths),
            "index_add by src": lambda: vals.new_zeros(num_src, width).index_add(0, src, vals),
            "index_select by src": lambda: vals[:num_src].index_select(0, src) if num_src <= E else None,
            "scatter_reduce amax by dst": lambda: vals.new_full((num_dst, width), float("-inf")).scatter_reduce(
                0, dst.unsqueeze(-1).expand_as(vals), vals, reduce="amax", include_self=True),
            "segment_reduce max (sorted dst)": lambda: torch.segment_reduce(vals, "max", lengths=lengths),
        }
        order = torch.argsort(src, stable=True)
        src_lengths = torch.bincount(src, minlength=num_src)
        res["sort by src + segment_reduce"] = lambda: torch.segment_reduce(vals.index_select(0, order), "sum",
                                                                           lengths=src_lengths)
        for name, fn in res.items():
            try:
                med, p10, p90 = timed(fn)
                gb = vals.numel() * vals.element_size() / 1e9
                print(f"  {str(dtype)[6:]:>8} x{width:<4} {name:<34} {med * 1e3:8.0f} us [{p10 * 1e3:.0f}, {p90 * 1e3:.0f}]"
                      f"  {gb / (med / 1e3):6.0f} GB/s of input")
            except Exception as err:  # noqa: BLE001 - a benchmark row that cannot run says why
                print(f"  {name}: {type(err).__name__}: {str(err)[:120]}")
        sys.stdout.flush()


if __name__ == "__main__":
    t0 = time.time()
    main()
    print(f"done in {time.time() - t0:.0f} s")
