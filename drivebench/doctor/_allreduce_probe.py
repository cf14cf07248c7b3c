"""Child probe: an NCCL all-reduce between every listed GPU pair, one process per GPU.

Run by the doctor with the NCCL environment under test (``NCCL_P2P_DISABLE=1`` or not) already set,
so it is in place before any process group exists. ``torch.multiprocessing.spawn`` starts one
worker per GPU; for each pair, the two ranks all-reduce a buffer in a two-rank group, time a few
iterations after warm-up, verify the sum, and rank ``a`` prints the record. Ranks wait for each
other between pairs on a gloo group, so NCCL is only ever used by the pair under test.
"""

from __future__ import annotations

import argparse
import datetime
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from drivebench.doctor.probe import emit


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _pair_allreduce(device: torch.device, rank: int, a: int, b: int, group: object, nbytes: int, warmup: int,
                    iters: int) -> dict:
    buf = torch.empty(nbytes // 4, dtype=torch.float32, device=device)
    buf.fill_(rank + 1)
    dist.all_reduce(buf, group=group)
    correct = bool((buf == float(a + b + 2)).all())  # host sync: one-off check that the sum arrived
    for _ in range(warmup):
        dist.all_reduce(buf, group=group)
    _sync(device)
    started = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(buf, group=group)
    _sync(device)
    seconds = (time.perf_counter() - started) / iters
    algbw = nbytes / seconds / 1e9
    return {"ms": seconds * 1e3, "algbw_gbs": algbw, "busbw_gbs": algbw * 2 * (2 - 1) / 2, "correct": correct}


def _worker(rank: int, world: int, pairs: list[tuple[int, int]], nbytes: int, warmup: int, iters: int,
            backend: str) -> None:
    if backend == "nccl":
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    else:  # gloo on the CPU: the same orchestration, testable without GPUs
        device = torch.device("cpu")
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    sync = dist.new_group(backend="gloo")
    for a, b in pairs:
        group = dist.new_group(ranks=[a, b])  # every rank takes part in creating every group
        if rank in (a, b):
            if rank == a:
                emit({"event": "start", "pair": [a, b]})
            try:
                result = _pair_allreduce(device, rank, a, b, group, nbytes, warmup, iters)
            except Exception as err:
                result = {"error": f"{type(err).__name__}: {err}"}
            if rank == a:
                emit({"event": "done", "pair": [a, b], **result})
        dist.barrier(group=sync)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--pairs", required=True, help="comma-separated a-b GPU index pairs")
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--backend", default="nccl", choices=("nccl", "gloo"))
    args = parser.parse_args()
    pairs = [tuple(int(x) for x in token.split("-")) for token in args.pairs.split(",")]
    mp.spawn(_worker, args=(args.world, pairs, args.mib * 2**20, args.warmup, args.iters, args.backend),
             nprocs=args.world)


if __name__ == "__main__":
    main()
