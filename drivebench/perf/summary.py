"""Turn a run's measurements into ``summary.json`` (schema: docs/summary.md) and a terminal table."""

from __future__ import annotations

import json
import math
import re
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any, Sequence

from drivebench.perf.callback import PhaseTimes, StepRecord, ValidationRecord
from drivebench.perf.compile_cache import compile_cache_state, graphs_from_cache
from drivebench.perf.stats import describe
from drivebench.perf.system import SystemMonitor

SCHEMA_VERSION = 1
# run.status of a summary written when training starts (bench/running_summary.py) and of one a later error ended
RUNNING, FAILED = "running", "failed"

_DETAIL_METRIC = re.compile(r"@|^d\d+\.|^AP_")
LOSS_STEPS = (10, 50, 100, 200, 300, 500, 1000, 2000, 5000, 10000)


def phase_stats(times: PhaseTimes, monitor: SystemMonitor | None = None) -> dict[str, Any]:
    """Warm-up-excluded statistics of one phase."""
    measured = times.measured()
    profiled = times.profiled()
    out: dict[str, Any] = {
        "steps_total": len(times.records),
        "warmup_steps": sum(1 for r in times.records if r.warmup),
        "steps_measured": len(measured),
    }
    if profiled:
        out["profiled_steps"] = len(profiled)
    if not measured:
        out["note"] = "no step past warm-up: raise bench.steps"
        return out
    wall = sum(r.step_s for r in measured)
    samples = sum(r.samples for r in measured)
    out.update(
        wall_s=wall,
        samples=samples,
        samples_per_s=samples / wall if wall > 0 else math.nan,
        samples_per_s_per_step=describe(r.samples / r.step_s for r in measured if r.step_s > 0),
        step_s=describe(r.step_s for r in measured),
        data_wait_s=describe(r.data_wait_s for r in measured),
        h2d_s=describe(r.h2d_s for r in measured),
        gpu_preprocess_s=describe(r.gpu_preprocess_s for r in measured),
        compute_s=describe(r.compute_s for r in measured),
        ckpt_blocking_s=describe(r.ckpt_s for r in measured),
        loop_overhead_s=describe(r.loop_overhead_s for r in measured),
        batch_elements=describe(r.elements for r in measured),
        data_wait_fraction=sum(r.data_wait_s for r in measured) / wall if wall > 0 else math.nan,
        loop_overhead_fraction=sum(r.loop_overhead_s for r in measured) / wall if wall > 0 else math.nan,
    )
    device = [r.device_compute_s for r in measured if r.device_compute_s is not None]
    if device:
        out["device_compute_s"] = describe(device)
        out["device_busy_fraction"] = sum(device) / wall if wall > 0 else math.nan
    h2d_dev = [r.device_h2d_s for r in measured if r.device_h2d_s is not None]
    if h2d_dev:
        out["device_h2d_s"] = describe(h2d_dev)
    if monitor is not None and times.measured_started is not None and times.ended is not None:
        window = monitor.window(times.measured_started, times.ended)
        gpu = [s.gpu_util_pct for s in window if s.gpu_util_pct is not None]
        out["system"] = {
            "samples": len(window),
            "gpu_util_pct": describe(gpu) if gpu else None,
            "gpu_mem_gb": describe(s.gpu_mem_gb for s in window if s.gpu_mem_gb is not None) if gpu else None,
            "cpu_main_pct": describe(s.cpu_main_pct for s in window),
            "cpu_workers_pct": describe(s.cpu_workers_pct for s in window),
            "cpu_system_pct": describe(s.cpu_system_pct for s in window),
            "run_queue": describe(s.run_queue for s in window if s.run_queue is not None),
            "load_1m": describe(s.load_1m for s in window if s.load_1m is not None),
        }
    return out


def validation_stats(records: Sequence[ValidationRecord]) -> dict[str, Any]:
    """Where the validations during fit spent their time (``train.validation``; docs/summary.md).

    The first run is reported on its own (``first_s``) and left out of the distributions when later
    ones exist: it pays one-off costs (workers forked for the first time, lazy compiles in eval mode)
    that would otherwise widen every spread.
    """
    if not records:
        return {"runs": 0}
    steady = list(records[1:]) or list(records)
    return {
        "runs": len(records),
        "steps": [r.step for r in records],
        "total_s": sum(r.wall_s for r in records),
        "first_s": records[0].wall_s,
        "batches": statistics.median_low(r.batches for r in records),  # a count that ran
        "wall_s": describe(r.wall_s for r in steady),
        "lead_in_s": describe(r.lead_in_s for r in steady),
        "first_wait_s": describe(r.first_wait_s for r in steady),
        "wait_s": describe(r.wait_s for r in steady),
        "forward_s": describe(r.forward_s for r in steady),
        "epoch_end_s": describe(r.epoch_end_s for r in steady),
    }


def loss_summary(records: Sequence[StepRecord]) -> dict[str, Any]:
    """Training loss at fixed steps (mean of a 5-step window ending there), first and final."""
    losses = [r.loss for r in records]
    finite = [v for v in losses if v is not None and math.isfinite(v)]
    if not finite:
        return {"first": None, "final": None, "at_steps": {}, "nonfinite_steps": len(losses)}

    def window_mean(end: int) -> float | None:
        vals = [v for v in losses[max(end - 5, 0):end] if v is not None and math.isfinite(v)]
        return sum(vals) / len(vals) if vals else None

    return {
        "first": window_mean(min(5, len(losses))),
        "final": window_mean(len(losses)),
        "at_steps": {str(s): window_mean(s) for s in LOSS_STEPS if s <= len(losses)},
        "nonfinite_steps": sum(1 for v in losses if v is None or not math.isfinite(v)),
    }


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (str, int, bool)) or obj is None:
        return obj
    if hasattr(obj, "item"):
        return _jsonable(obj.item())
    return str(obj)


def write_summary(path: Path, summary: dict[str, Any]) -> Path:
    """Write atomically (temp file + rename): a reader never sees half a summary."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".summary-", suffix=".json", dir=path.parent)
    with os.fdopen(fd, "w") as fh:
        json.dump(_jsonable(summary), fh, indent=2, sort_keys=False)
        fh.write("\n")
    os.replace(tmp, path)
    return path


def _fmt(value: Any, unit: str = "", scale: float = 1.0, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{value * scale:.{digits}g}{unit}"


def _profile_rows(profile: dict[str, Any] | None) -> list[tuple[str, str]]:
    """The profile block's headline figures (bench.profile)."""
    if not profile:
        return []
    if not profile.get("steps"):
        return [("profile", str(profile.get("note", "no trace")))]
    host, gpu, compare = profile.get("host") or {}, profile.get("gpu"), profile.get("compare") or {}
    rows = [("profile (steps, trace)", f"{profile['steps']} steps from step {profile.get('first_step')}, "
                                       f"{profile.get('trace')}"),
            ("  host in aten ops / step", f"{_fmt(host.get('aten_op_s_per_step'), ' s')} "
                                          f"({_fmt(host.get('aten_ops_per_step'), digits=4)} dispatches)")]
    if gpu is None:
        rows.append(("  GPU", str(profile.get("gpu_note", "not measured"))))
    else:
        idle = gpu.get("idle_s_per_step") or {}
        rows += [
            ("  kernels / step", _fmt(gpu.get("kernels_per_step"), digits=4)),
            ("  GPU active / step", f"{_fmt(gpu.get('active_s_per_step'), ' s')} ({_fmt(gpu.get('active_fraction'), '%', 100)}"
                                    f"; NVML {_fmt(compare.get('nvml_gpu_busy_pct_median'), '%')}, CUDA-event span "
                                    f"{_fmt(compare.get('cuda_event_span_s_median'), ' s')})"),
            ("  GPU idle / step", ", ".join(f"{k.replace('_', ' ')} {_fmt(v, ' s')}" for k, v in idle.items())),
        ]
    top_ops = profile.get("top_ops") or []
    if top_ops:
        rows.append(("  top operator (self)", f"{top_ops[0]['name']} {_fmt(top_ops[0]['self_s_per_step'], ' s')}/step"))
    top_kernels = profile.get("top_kernels") or []
    if top_kernels:
        rows.append(("  top kernel", f"{top_kernels[0]['name'][:60]} {_fmt(top_kernels[0]['s_per_step'], ' s')}/step"))
    return rows


def _validation_rows(validation: dict[str, Any] | None) -> list[tuple[str, str]]:
    """The validations during fit: how long, and which part of them (``train.validation``)."""
    if not (validation or {}).get("runs"):
        return []
    median = {k: (validation.get(k) or {}).get("median") for k in
              ("wall_s", "forward_s", "first_wait_s", "wait_s", "epoch_end_s", "lead_in_s")}
    runs, total = validation["runs"], _fmt(validation.get("total_s"), " s")
    head = f"{runs} run{'s' if runs > 1 else ''} of {_fmt(validation.get('batches'))} batches, " + (
        f"{total} in all; first {_fmt(validation.get('first_s'), ' s')}, then median {_fmt(median['wall_s'], ' s')}"
        if runs > 1 else total)
    split = (f"forward {_fmt(median['forward_s'], ' s')}, first batch {_fmt(median['first_wait_s'], ' s')}, "
             f"later waits {_fmt(median['wait_s'], ' s')}, epoch end {_fmt(median['epoch_end_s'], ' s')} "
             f"(+ lead-in {_fmt(median['lead_in_s'], ' s')})")
    return [("validation during fit", head), ("  validation split (median)", split)]


def render_table(summary: dict[str, Any]) -> str:
    """A short plain-text table of what the run measured (printed at the end of every run)."""
    rows: list[tuple[str, str]] = []
    run = summary.get("run", {})
    rows.append(("model / accel", f"{run.get('model')} ({run.get('model_size')}) / {run.get('accel')}"))
    machine = summary.get("machine", {})
    gpus = machine.get("gpus") or []
    rows.append(("machine", f"{gpus[0]['name'] + ' x' + str(len(gpus)) if gpus else 'CPU only'}, "
                            f"{machine.get('cpu_cores')} cores"))
    resume = run.get("resume") or {}
    if resume:
        rows.append(("resumed from", f"{resume['from']} (step {resume['step']}; {resume['how']})" if resume.get("from")
                     else f"- ({resume.get('how')})"))
    threads = (summary.get("settings") or {}).get("threads") or {}
    if threads.get("note"):
        rows.append(("threads", f"{threads['note']} ({threads.get('cores_source')})"))
    train = summary.get("train") or {}
    if train.get("steps_measured"):
        step = train["step_s"]
        rows += [
            ("steps measured (warm-up)", f"{train['steps_measured']} ({train['warmup_steps']}"
                                         + (f"; {train['profiled_steps']} profiled, left out" if train.get("profiled_steps")
                                            else "") + ")"),
            ("throughput", f"{_fmt(train['samples_per_s'])} samples/s"
                           + (f" per process, {_fmt(train['global_samples_per_s'])} global"
                              if train.get("global_samples_per_s") else "")),
            ("step time median [p10, p90]",
             f"{_fmt(step['median'], ' s')} [{_fmt(step['p10'])}, {_fmt(step['p90'])}]"),
            ("data wait", f"{_fmt(train['data_wait_fraction'], '%', 100)} of step time "
                          f"(median {_fmt(train['data_wait_s']['median'], ' s')})"),
            ("host-to-device median", _fmt(train["h2d_s"]["median"], " s")),
        ]
        if train.get("loop_overhead_fraction") is not None:
            rows.append(("loop overhead + host sync", f"{_fmt(train['loop_overhead_fraction'], '%', 100)} of step time"))
        if "device_busy_fraction" in train:
            rows.append(("device span (CUDA events)", _fmt(train["device_busy_fraction"], "%", 100)))
        gpu_util = (train.get("system") or {}).get("gpu_util_pct")
        if gpu_util:
            rows.append(("GPU busy, median (NVML)", _fmt(gpu_util["median"], "%")))
    rows += _validation_rows(train.get("validation"))
    ceiling = summary.get("ceiling") or {}
    if ceiling.get("steps_measured"):
        rows.append(("ceiling throughput", f"{_fmt(ceiling['samples_per_s'])} samples/s"))
    if summary.get("efficiency") is not None:
        note = summary.get("efficiency_note")
        rows.append(("efficiency (train / ceiling)", _fmt(summary["efficiency"], "%", 100)
                     + (f" ({note})" if note else "")))
    loader = summary.get("loader") or {}
    if loader.get("samples_per_s") is not None:
        rows.append(("loader throughput", f"{_fmt(loader['samples_per_s'])} samples/s"))
    loss = summary.get("loss") or {}
    if loss.get("first") is not None:
        rows.append(("train loss first -> final", f"{_fmt(loss['first'])} -> {_fmt(loss['final'])}"))
    for key, value in (summary.get("val") or {}).items():
        if _DETAIL_METRIC.search(key):  # per-threshold / per-class / per-layer figures: in summary.json
            continue
        note = (summary.get("val_notes") or {}).get(key)
        rows.append((f"val {key}", _fmt(value) + (f" ({note})" if note else "")))
    mem = summary.get("memory") or {}
    if mem.get("peak_device_gb") is not None:
        trial_peak = ((summary.get("autotune") or {}).get("in_run_trial") or {}).get("peak_device_gb")
        rows.append(("peak device memory", _fmt(mem["peak_device_gb"], " GiB")
                     + (f" (after the accel trial; its segments: {_fmt(trial_peak, ' GiB')})" if trial_peak else "")))
    compiled = (summary.get("settings") or {}).get("compile_report") or {}
    if (compiled.get("compile_s") or {}).get("total"):
        counts, state = graphs_from_cache(compiled), compile_cache_state(compiled)
        recompiles = (compiled.get("recompiles") or {}).get("count")
        rows.append(("compiling", f"{_fmt(compiled['compile_s']['total'], ' s')} in this run"
                     + (f", {state} cache ({counts[0]} of {counts[1]} graphs from it)" if counts else "")
                     + (f"; {recompiles} recompile{'s' if recompiles > 1 else ''} (why: summary.json "
                        "settings.compile_report.recompiles)" if recompiles else "")))
    rows += _profile_rows(summary.get("profile"))
    trial = summary.get("autotune") or {}
    if trial:
        changed = ", ".join(f"{k}={v}" for k, v in (trial.get("changed") or {}).items()) or "the preset's own values"
        rows.append(("accel trial (accel=auto)", f"{len(trial.get('trials') or [])} rows, {_fmt(trial.get('cost_s'), ' s')}"
                     + (f" ({_fmt(trial['cost_fraction_of_run'], '%', 100)} of the run)" if trial.get("cost_fraction_of_run") else "")
                     + f"; chose {changed}"))
    bottleneck = summary.get("bottleneck") or {}
    if bottleneck.get("verdict"):
        rows += [("bottleneck", str(bottleneck["verdict"])), ("  evidence", str(bottleneck.get("evidence"))),
                 ("  next", str(bottleneck.get("next")))]
        if bottleneck.get("also"):  # the other rules that hold, by name (their numbers: summary.json)
            rows.append(("  also", ", ".join(a.split(":")[0] for a in bottleneck["also"])))
    rows.append(("summary", str(summary.get("paths", {}).get("summary", ""))))
    width = max(len(k) for k, _ in rows)
    line = "-" * (width + 40)
    body = "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)
    return f"{line}\ndrivebench run summary\n{line}\n{body}\n{line}"
