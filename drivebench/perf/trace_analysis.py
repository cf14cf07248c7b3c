"""What a ``torch.profiler`` trace says about the training step, per profiled step.

Reads the Chrome/Perfetto JSON trace that ``torch.profiler`` exports (``.json`` or ``.json.gz``) and
computes, over the ``ProfilerStep#N`` windows it holds:

* kernels launched per step and GPU active time per step (the union of kernel intervals on the
  device timeline, the figure NVML's utilisation samples), copies and memsets apart;
* GPU idle time per step, split by what the GPU was waiting for. The split follows Holistic Trace
  Analysis (HTA): an idle gap is *host wait* when the kernel that ends it was launched by the host
  only after the gap began; otherwise it is device-side (a queued kernel waiting on a dependency or
  the launch latency). The host-wait part is split further by what the host was doing meanwhile:
  blocked in the train loader's ``next()`` (``waiting_for_data``), just back from a synchronising
  call that drained the queue (``synchronisation``: ``cudaStreamSynchronize``, ``.item()``'s copy,
  ...), or anything else, Python and dispatch (``waiting_for_host``);
* host time per step inside aten operators (the dispatcher and what it calls, summed over threads:
  the autograd engine runs backward on its own thread on CUDA), the number of top-level aten calls
  (dispatches from Python or autograd), CUDA launch calls and synchronising calls;
* the top kernels and the top operators by self time.

Why not HTA itself: HTA 0.5 installs and parses these traces, but its temporal and idle-time
breakdowns fail on a CPU-only trace (no kernels), it has no data-wait or sync split, and it pulls
jupyterlab and pytest in as runtime dependencies. The definitions above are HTA's where it has one.

All times in the trace are microseconds; every figure returned is in seconds.
"""

from __future__ import annotations

import bisect
import gzip
import json
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable

from drivebench.perf.stats import describe

Event = dict[str, Any]
Intervals = list[tuple[float, float]]

STEP_PREFIX = "ProfilerStep#"
DATA_WAIT_ANNOTATION = "drivebench/data_wait"  # put around the train loader's next() (perf.loader_wait)
DATALOADER_PREFIX = "enumerate(DataLoader)#"   # torch's own annotation of DataLoader iterators' __next__
SYNC_CALLS = frozenset({
    "cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cudaMemcpy",
    "cuCtxSynchronize", "cuStreamSynchronize", "cuEventSynchronize",
})
COMM_OP_PREFIXES = ("nccl:", "gloo:", "c10d::")
SYNC_SLACK_US = 10.0  # a sync returns a few microseconds after the device drained its queue
_HOST_TREE_CATS = frozenset({"cpu_op", "cuda_runtime", "cuda_driver", "user_annotation"})
_OP_CATS = frozenset({"cpu_op", "cuda_runtime", "cuda_driver"})


def load_trace(path: Path | str) -> dict[str, Any]:
    """A trace file as exported by ``torch.profiler`` (gzip when the name ends in ``.gz``)."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as fh:
        return json.load(fh)


# ---- intervals -------------------------------------------------------------------------------------
def union(intervals: Iterable[tuple[float, float]]) -> Intervals:
    """Sorted, merged intervals."""
    merged: Intervals = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            if b > merged[-1][1]:
                merged[-1] = (merged[-1][0], b)
        else:
            merged.append((a, b))
    return merged


def clip(merged: Intervals, lo: float, hi: float) -> Intervals:
    return [(max(a, lo), min(b, hi)) for a, b in merged if b > lo and a < hi]


def total(merged: Intervals) -> float:
    return sum(b - a for a, b in merged)


def overlap(merged: Intervals, lo: float, hi: float) -> float:
    """Length of [lo, hi] covered by sorted, merged intervals."""
    if hi <= lo or not merged:
        return 0.0
    i = max(bisect.bisect_right(merged, (lo, float("inf"))) - 1, 0)
    covered = 0.0
    while i < len(merged) and merged[i][0] < hi:
        a, b = merged[i]
        covered += max(min(b, hi) - max(a, lo), 0.0)
        i += 1
    return covered


def gaps(merged: Intervals, lo: float, hi: float) -> Intervals:
    """The parts of [lo, hi] that no interval covers."""
    out: Intervals = []
    cursor = lo
    for a, b in clip(merged, lo, hi):
        if a > cursor:
            out.append((cursor, a))
        cursor = max(cursor, b)
    if cursor < hi:
        out.append((cursor, hi))
    return out


# ---- events ----------------------------------------------------------------------------------------
def _span(e: Event) -> tuple[float, float]:
    ts = float(e["ts"])
    return ts, ts + float(e.get("dur", 0.0))


def _correlation(e: Event) -> Any:
    return (e.get("args") or {}).get("correlation")


def _self_times(events: list[Event]) -> dict[int, float]:
    """Self time of each host event (``id(event)`` -> us): its duration minus its direct children's,
    nesting taken per thread from the timestamps."""
    by_thread: dict[tuple[Any, Any], list[Event]] = defaultdict(list)
    for e in events:
        by_thread[(e.get("pid"), e.get("tid"))].append(e)
    self_us: dict[int, float] = {}
    for thread_events in by_thread.values():
        thread_events.sort(key=lambda e: (float(e["ts"]), -float(e.get("dur", 0.0))))
        stack: list[tuple[float, Event]] = []
        for e in thread_events:
            start, end = _span(e)
            while stack and stack[-1][0] <= start:
                stack.pop()
            self_us[id(e)] = end - start
            if stack:
                parent = stack[-1][1]
                self_us[id(parent)] -= end - start
            stack.append((end, e))
    return self_us


def _top_level_aten(events: list[Event]) -> int:
    """aten calls not made from inside another aten call: the dispatches from Python or autograd."""
    by_thread: dict[tuple[Any, Any], list[Event]] = defaultdict(list)
    for e in events:
        if e.get("cat") == "cpu_op":
            by_thread[(e.get("pid"), e.get("tid"))].append(e)
    count = 0
    for thread_events in by_thread.values():
        thread_events.sort(key=lambda e: (float(e["ts"]), -float(e.get("dur", 0.0))))
        aten_ends: list[float] = []  # ends of the enclosing aten ops
        for e in thread_events:
            start, end = _span(e)
            while aten_ends and aten_ends[-1] <= start:
                aten_ends.pop()
            if str(e.get("name", "")).startswith("aten::"):
                if not aten_ends:
                    count += 1
                aten_ends.append(end)
    return count


def _ranked(totals: dict[str, list[float]], n_steps: int, whole_us: float, top_k: int,
            value: str) -> list[dict[str, Any]]:
    rows = sorted(totals.items(), key=lambda kv: -kv[1][1])[:top_k]
    return [{"name": name[:160], "calls_per_step": calls / n_steps, value: us / 1e6 / n_steps,
             "share": us / whole_us if whole_us > 0 else None} for name, (calls, us) in rows]


def analyse_trace(trace: dict[str, Any], top_k: int = 10, max_steps: int | None = None) -> dict[str, Any]:
    """The per-step figures of a trace (see the module docstring); ``gpu`` is None without kernels.
    ``max_steps``: only the first step windows (a window cut short by the end of training leaves
    one more, opened by the last step and closed by the end of training, that holds no step)."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "ts" in e]
    steps = sorted((e for e in events if str(e.get("name", "")).startswith(STEP_PREFIX)
                    and e.get("cat") != "gpu_user_annotation"), key=lambda e: float(e["ts"]))[:max_steps]
    if not steps:
        return {"steps": 0, "note": f"the trace holds no {STEP_PREFIX}N window: nothing to divide by"}
    n = len(steps)
    lo, hi = float(steps[0]["ts"]), max(_span(s)[1] for s in steps)
    window_us = hi - lo
    host = [e for e in events if e.get("cat") in _HOST_TREE_CATS and lo <= float(e["ts"]) < hi]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    runtime = [e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")]
    out: dict[str, Any] = {
        "steps": n,
        "step_s": describe((float(s.get("dur", 0.0)) / 1e6 for s in steps)),
        "window_s": window_us / 1e6,
        "device": "cuda" if kernels or runtime else "cpu",
    }

    # ---- host side
    self_us = _self_times(host)
    aten = [e for e in host if e.get("cat") == "cpu_op" and str(e.get("name", "")).startswith("aten::")]
    aten_by_thread: dict[Any, list[tuple[float, float]]] = defaultdict(list)
    for e in aten:
        aten_by_thread[(e.get("pid"), e.get("tid"))].append(_span(e))
    aten_us = sum(total(union(spans)) for spans in aten_by_thread.values())
    launches = [e for e in host if e.get("cat") in ("cuda_runtime", "cuda_driver")
                and ("LaunchKernel" in e["name"] or "GraphLaunch" in e["name"])]
    syncs = [e for e in host if e.get("name") in SYNC_CALLS]
    comm_host = union(_span(e) for e in host if e.get("cat") == "cpu_op"
                      and str(e.get("name", "")).startswith(COMM_OP_PREFIXES))
    outside_ops_us = sum(self_us[id(s)] for s in steps if id(s) in self_us)
    out["host"] = {
        "aten_ops_per_step": _top_level_aten(host) / n,
        "aten_op_s_per_step": aten_us / 1e6 / n,
        "aten_op_fraction": aten_us / window_us if window_us > 0 else None,
        "outside_ops_s_per_step": outside_ops_us / 1e6 / n,
        "launch_calls_per_step": len(launches) / n,
        "launch_api_s_per_step": sum(float(e.get("dur", 0.0)) for e in launches) / 1e6 / n,
        "sync_calls_per_step": len(syncs) / n,
        "sync_s_per_step": total(union(_span(e) for e in syncs)) / 1e6 / n,
        "comm_op_s_per_step": total(comm_host) / 1e6 / n,
    }
    op_totals: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for e in host:
        if e.get("cat") in _OP_CATS:
            row = op_totals[str(e["name"])]
            row[0] += 1
            row[1] += max(self_us.get(id(e), 0.0), 0.0)
    out["top_ops"] = _ranked(op_totals, n, window_us, top_k, "self_s_per_step")

    # ---- device side
    if not kernels:
        out["gpu"] = None
        out["gpu_note"] = ("no CUDA kernels in the trace (a CPU-only run): kernels per step, GPU active "
                           "and idle times are not measured")
        out["top_kernels"] = []
        return out
    in_window = [k for k in kernels if lo <= float(k["ts"]) < hi]
    busy = union(_span(k) for k in kernels)
    busy_in = clip(busy, lo, hi)
    active_us = total(busy_in)
    copies = union(_span(e) for e in events if e.get("cat") in ("gpu_memcpy", "gpu_memset"))
    comm = union(_span(k) for k in kernels if str(k.get("name", "")).startswith("nccl"))
    compute = union(_span(k) for k in kernels if not str(k.get("name", "")).startswith("nccl"))
    comm_in = clip(comm, lo, hi)
    comm_exposed = sum(b - a - overlap(compute, a, b) for a, b in comm_in)
    idle = classify_idle(busy, kernels, runtime, data_wait_intervals(host), union(_span(e) for e in syncs), lo, hi)
    out["gpu"] = {
        "kernels_per_step": len(in_window) / n,
        "active_s_per_step": active_us / 1e6 / n,
        "active_fraction": active_us / window_us if window_us > 0 else None,
        "memcpy_memset_s_per_step": total(clip(copies, lo, hi)) / 1e6 / n,
        "idle_s_per_step": {k: v / 1e6 / n for k, v in idle.items()},
        "comm_kernel_s_per_step": total(comm_in) / 1e6 / n,
        "comm_exposed_s_per_step": comm_exposed / 1e6 / n,
    }
    kernel_totals: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for k in in_window:
        row = kernel_totals[str(k["name"])]
        row[0] += 1
        row[1] += float(k.get("dur", 0.0))
    out["top_kernels"] = _ranked(kernel_totals, n, active_us, top_k, "s_per_step")
    return out


def data_wait_intervals(host: list[Event]) -> Intervals:
    """Host time blocked in the train loader: drivebench's annotation, else torch DataLoader's own."""
    ours = [_span(e) for e in host if e.get("name") == DATA_WAIT_ANNOTATION]
    if ours:
        return union(ours)
    return union(_span(e) for e in host if str(e.get("name", "")).startswith(DATALOADER_PREFIX))


def classify_idle(busy: Intervals, kernels: list[Event], runtime: list[Event], data_wait: Intervals,
                  syncs: Intervals, lo: float, hi: float) -> dict[str, float]:
    """Idle microseconds in [lo, hi] by cause: waiting_for_host, waiting_for_data, synchronisation,
    device_side (see the module docstring)."""
    launch_at = {}
    for e in runtime:
        c = _correlation(e)
        if c is not None:
            launch_at[c] = float(e["ts"])
    starts = sorted((float(k["ts"]), launch_at.get(_correlation(k))) for k in kernels)
    start_keys = [s for s, _ in starts]
    sync_ends = sorted(b for _, b in syncs)
    sync_by_end = sorted(syncs, key=lambda ab: ab[1])
    out = {"waiting_for_host": 0.0, "waiting_for_data": 0.0, "synchronisation": 0.0, "device_side": 0.0}
    for a, b in gaps(busy, lo, hi):
        i = bisect.bisect_left(start_keys, b)
        launched = starts[i][1] if i < len(starts) and b < hi else None
        host_end = b if launched is None else min(max(launched, a), b)
        out["device_side"] += b - host_end
        host_wait = host_end - a
        if host_wait <= 0:
            continue
        data = overlap(data_wait, a, host_end)
        out["waiting_for_data"] += data
        # a sync that ended once the queue drained (at or after the gap began) and before the launch
        j = bisect.bisect_left(sync_ends, a - SYNC_SLACK_US)
        drained = j < len(sync_by_end) and sync_by_end[j][0] <= host_end
        out["synchronisation" if drained else "waiting_for_host"] += host_wait - data
    return out
