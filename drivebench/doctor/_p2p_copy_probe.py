"""Child probe: driver-reported P2P access and a timed, verified device-to-device copy per GPU pair.

Run by the doctor as ``python -m drivebench.doctor._p2p_copy_probe --pairs 0-1,0-2 --mib 64``; it
prints one record per pair (see :func:`drivebench.doctor.probe.emit`) and is killed if it hangs.
"""

from __future__ import annotations

import argparse
import time

import torch

from drivebench.doctor.probe import emit


def measure_copy(a: int, b: int, nbytes: int, iters: int) -> dict[str, object]:
    numel = nbytes // 4
    src = torch.arange(numel, dtype=torch.int32, device=f"cuda:{a}")
    dst = torch.empty(numel, dtype=torch.int32, device=f"cuda:{b}")
    dst.copy_(src)  # warm-up: enables peer access, allocates
    torch.cuda.synchronize(a)
    torch.cuda.synchronize(b)
    started = time.perf_counter()
    for _ in range(iters):
        dst.copy_(src)
    torch.cuda.synchronize(a)
    torch.cuda.synchronize(b)
    seconds = (time.perf_counter() - started) / iters
    expected = torch.arange(numel, dtype=torch.int32, device=f"cuda:{b}")
    correct = bool(torch.equal(dst, expected))  # host sync: a one-off correctness check of the copy
    return {"copy_gbs": nbytes / seconds / 1e9, "copy_ms": seconds * 1e3, "correct": correct}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", required=True, help="comma-separated a-b GPU index pairs")
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--iters", type=int, default=5)
    args = parser.parse_args()
    for token in args.pairs.split(","):
        a, b = (int(x) for x in token.split("-"))
        emit({"event": "start", "pair": [a, b]})
        record: dict[str, object] = {"event": "done", "pair": [a, b],
                                     "access_ab": torch.cuda.can_device_access_peer(a, b),
                                     "access_ba": torch.cuda.can_device_access_peer(b, a)}
        try:
            record.update(measure_copy(a, b, args.mib * 2**20, args.iters))
        except Exception as err:  # report and go on with the next pair
            record["error"] = f"{type(err).__name__}: {err}"
        emit(record)


if __name__ == "__main__":
    main()
