"""Read runs into pandas: one row per run from ``summary.json``, the TensorBoard scalars in long form.

Nothing here raises on a bad run: a run without a summary, with ``status != completed`` or with a
summary that is not JSON becomes a :class:`Problem` naming its folder; a summary of another
schema version is read as far as its keys allow, with a warning. The notebooks call
:func:`load_runs` too, so they see exactly what the report sees.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from drivebench.accel.settings import DECODE_CHANGE
from drivebench.perf.bottleneck import diagnose, efficiency_note, gpu_memory_of_others_gb, shares_gpu
from drivebench.perf.compile_cache import compile_cache_state
from drivebench.perf.summary import FAILED, RUNNING
from drivebench.report.discovery import RunDir, find_run_dirs
from drivebench.report.events import read_scalars
from drivebench.report.labels import (command_overrides, hardware_label, machine_label, setting_label,
                                      setting_overrides)

KNOWN_SCHEMA_VERSIONS = (1,)
COMPLETED = "completed"
SKIPPED = "skipped"
INTERRUPTED = "interrupted"


@dataclass
class Problem:
    """A run the report could not use, and why (shown in report.md and on the terminal)."""

    run_dir: Path
    kind: str  # crashed | unreadable | skipped | interrupted | died
    reason: str
    model: str | None = None
    accel: str | None = None


@dataclass
class RunSet:
    """Everything read from a set of folders."""

    runs: pd.DataFrame          # one row per completed run (columns: see summary_row)
    scalars: pd.DataFrame       # run, phase, tag, step, value, wall_time, elapsed_s (completed and stopped runs)
    problems: list[Problem] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # runs stopped by a signal before their schedule ended (also in problems): no throughput figure counts,
    # but the validation they logged before the stop is a curve the convergence tables can use
    stopped: pd.DataFrame = field(default_factory=pd.DataFrame)


# ---- small helpers --------------------------------------------------------------------------------
def dig(data: Any, *keys: str) -> Any:
    """``data[k1][k2]...`` or None where a level is missing or not a mapping."""
    for key in keys:
        if not isinstance(data, dict):
            return None
        data = data.get(key)
    return data


def mapping(value: Any) -> dict[str, Any]:
    """``value`` if it is a mapping, else an empty one (a damaged or foreign summary section)."""
    return value if isinstance(value, dict) else {}


def num(value: Any) -> float:
    """A finite float, or NaN for anything else (None, strings, inf)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return math.nan
    value = float(value)
    return value if math.isfinite(value) else math.nan


def _most(values: Any) -> float:
    """The largest finite number of ``values`` (NaN when there is none)."""
    finite = [v for v in map(num, values) if not math.isnan(v)]
    return max(finite) if finite else math.nan


def _read_yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return None


def _hydra_overrides(run: RunDir) -> list[str] | None:
    if run.hydra_dir is None:
        return None
    data = _read_yaml(run.hydra_dir / "overrides.yaml")
    return [str(x) for x in data] if isinstance(data, list) else None


def _job_num(run: RunDir) -> float:
    if run.hydra_dir is None:
        return math.nan
    return num(dig(_read_yaml(run.hydra_dir / "hydra.yaml"), "hydra", "job", "num"))


def _error_line(run: RunDir) -> str | None:
    """The last line of the run's Hydra log that mentions an error, if any (why it crashed)."""
    for log in reversed(run.logs):
        try:
            lines = log.read_text(errors="replace").splitlines()
        except OSError:
            continue
        for line in reversed(lines):
            if "error" in line.lower() or "exception" in line.lower():
                return line.strip()[:240]
    return None


# ---- one summary -> one row -----------------------------------------------------------------------
def summary_row(summary: dict[str, Any], run: RunDir) -> dict[str, Any]:
    """Flatten what the report shows of one run's summary into a row (missing keys -> NaN/None)."""
    r = mapping(summary.get("run"))
    machine = mapping(summary.get("machine"))
    train = mapping(dig(summary, "train"))
    ceiling = mapping(dig(summary, "ceiling"))
    loader = mapping(dig(summary, "loader"))
    accel = mapping(dig(summary, "settings", "accel"))

    overrides = _hydra_overrides(run)
    if overrides is None:  # no .hydra folder copied: the recorded command line (sweep lists skipped)
        overrides = [o for o in command_overrides(r.get("command")) if "," not in o]
    knobs = setting_overrides(overrides)
    accel_name = r.get("accel") or accel.get("name")

    if train.get("steps_measured"):
        phase, throughput = "train", mapping(dig(train, "samples_per_s_per_step"))
    elif ceiling.get("steps_measured"):
        phase, throughput = "ceiling", mapping(dig(ceiling, "samples_per_s_per_step"))
    elif loader:
        phase, throughput = "loader", {"median": loader.get("samples_per_s")}
    else:
        phase, throughput = None, {}

    verdict = summary.get("bottleneck") if isinstance(summary.get("bottleneck"), dict) else diagnose(summary)
    gpu_shared = shares_gpu(summary)  # a machine of its own in every comparison (labels.machine_label)
    ckpt_each = dig(summary, "checkpoints", "each") or []
    row: dict[str, Any] = {
        "run_dir": str(run.path),
        "status": r.get("status"),
        "schema_version": summary.get("schema_version"),
        "machine": machine_label(machine, r.get("machine_profile"), gpu_shared=gpu_shared),
        "hardware": hardware_label(machine),
        "hostname": machine.get("hostname"),
        "machine_profile": r.get("machine_profile"),
        "gpu_count": len(machine.get("gpus") or []),
        "cpu_model": machine.get("cpu_model"),
        "cpu_cores": num(machine.get("cpu_cores")),
        "ram_gb": num(machine.get("ram_gb")),
        "torch": machine.get("torch"),
        "cuda": machine.get("cuda"),
        "driver": machine.get("driver"),
        "model": r.get("model"),
        "model_size": r.get("model_size"),
        "data": r.get("data"),
        # another runner's run of the same work (bench=mmengine: compare_as=train) joins that group
        "bench": r.get("compare_as") or r.get("bench"),
        "runner": r.get("runner") or "drivebench",
        "dist": r.get("dist"),
        "p2p": dig(summary, "dist", "p2p", "applied"),           # DDP runs: the NCCL P2P setting in effect
        "experiment": dig(summary, "experiment", "name"),       # a named sweep that recorded its own keys
        "experiment_batch": dig(summary, "experiment", "batch"),  # +experiment=scaling: per_device | global
        "seed": num(r.get("seed")),
        "targets": " ".join(map(str, summary.get("targets") or [])),
        "accel": accel_name,
        "setting": " ".join(filter(None, [r.get("runner"), setting_label(accel_name, knobs)])),
        "setting_overrides": " ".join(f"{k}={v}" for k, v in sorted(knobs.items())),
        "job_num": _job_num(run),
        "run_id": r.get("run_id"),  # kept by a resumed run of the same training: its segments share it
        "schedule_steps": num(r.get("schedule_steps")),  # the fit's scheduled optimizer steps (runs since 2026-12-06)
        "started": r.get("started"),
        "run_wall_s": num(r.get("wall_s")),
        "batch_size": num(dig(summary, "settings", "batch_size")),
        "global_batch_size": num(dig(summary, "settings", "global_batch_size")),
        "parameters": num(dig(summary, "settings", "parameters")),
        "numerics_changed_by": ", ".join(map(str, dig(summary, "settings", "numerics_changed_by") or [])),
        "throughput_phase": phase,
        "steps_measured": num(train.get("steps_measured")),
        "warmup_steps": num(train.get("warmup_steps")),
        "train_wall_s": num(train.get("wall_s")),
        "samples_per_s": num(train.get("samples_per_s")),
        "throughput_median": num(throughput.get("median")),
        "throughput_p10": num(throughput.get("p10")),
        "throughput_p90": num(throughput.get("p90")),
        "global_samples_per_s": num(train.get("global_samples_per_s")),
        "step_s_median": num(dig(train, "step_s", "median")),
        "data_wait_fraction": num(train.get("data_wait_fraction")),
        # DDP: the highest data-wait share of any rank (the one that holds the others at the all-reduce)
        "data_wait_fraction_max_rank": _most(r.get("data_wait_fraction") for r in dig(summary, "ranks", "per_rank") or []
                                             if isinstance(r, dict)),
        "data_wait_s_median": num(dig(train, "data_wait_s", "median")),
        "loop_overhead_fraction": num(train.get("loop_overhead_fraction")),
        "h2d_s_median": num(dig(train, "h2d_s", "median")),
        "compute_s_median": num(dig(train, "compute_s", "median")),
        # validation during fit (train.validation): the first one, then the median of the later ones
        "validation_first_s": num(dig(train, "validation", "first_s")),
        "validation_s_median": num(dig(train, "validation", "wall_s", "median")),
        # means add up (medians do not): the step-time breakdown plot stacks these
        "step_s_mean": num(dig(train, "step_s", "mean")),
        "data_wait_s_mean": num(dig(train, "data_wait_s", "mean")),
        "loop_overhead_s_mean": num(dig(train, "loop_overhead_s", "mean")),
        "h2d_s_mean": num(dig(train, "h2d_s", "mean")),
        "gpu_preprocess_s_mean": num(dig(train, "gpu_preprocess_s", "mean")),
        "compute_s_mean": num(dig(train, "compute_s", "mean")),
        "ceiling_samples_per_s": num(ceiling.get("samples_per_s")),
        "efficiency": num(summary.get("efficiency")),
        # summaries written before the verdict existed get it from their own figures, by the same rules
        "efficiency_note": summary.get("efficiency_note") or efficiency_note(summary),
        "bottleneck": verdict.get("verdict"),
        "bottleneck_evidence": verdict.get("evidence"),
        "bottleneck_next": verdict.get("next"),
        "profile_kernels_per_step": num(dig(summary, "profile", "gpu", "kernels_per_step")),
        "profile_gpu_active_fraction": num(dig(summary, "profile", "gpu", "active_fraction")),
        "profile_aten_ops_per_step": num(dig(summary, "profile", "host", "aten_ops_per_step")),
        "device_busy_fraction": num(train.get("device_busy_fraction")),
        # seconds this run spent compiling, and whether Inductor's on-disk cache served it (a warm start)
        "compile_s": num(dig(summary, "settings", "compile_report", "compile_s", "total")),
        "compile_cache": compile_cache_state(dig(summary, "settings", "compile_report")),
        "gpu_util_pct_median": num(dig(train, "system", "gpu_util_pct", "median")),
        "cpu_main_pct_median": num(dig(train, "system", "cpu_main_pct", "median")),
        "cpu_workers_pct_median": num(dig(train, "system", "cpu_workers_pct", "median")),
        "peak_device_gb": num(dig(summary, "memory", "peak_device_gb")),
        "peak_device_reserved_gb": num(dig(summary, "memory", "peak_device_reserved_gb")),
        # GiB its GPU held beyond this run's own peak: another process's where it reaches SHARED_GPU_GB_MIN
        "gpu_others_gb": num(gpu_memory_of_others_gb(summary)),
        "gpu_shared": gpu_shared,
        "gpu_decode_unguarded": gpu_decode_unguarded(summary),
        "ckpt_saves": num(dig(summary, "checkpoints", "saves")),
        "ckpt_blocking_s_total": (sum(num(e.get("blocking_s")) for e in ckpt_each if isinstance(e, dict))
                                  if ckpt_each else math.nan),
        "ckpt_blocking_s_median": num(dig(summary, "checkpoints", "blocking_s", "median")),
        "loader_samples_per_s": num(loader.get("samples_per_s")),
        "autotune_changed": ", ".join(f"{k}={v}" for k, v in mapping(dig(summary, "autotune", "changed")).items()),
        "autotune_cost_s": num(dig(summary, "autotune", "cost_s")),
        "autotune_cost_fraction": num(dig(summary, "autotune", "cost_fraction_of_run")),
        "loss_first": num(dig(summary, "loss", "first")),
        "loss_final": num(dig(summary, "loss", "final")),
        "loss_nonfinite_steps": num(dig(summary, "loss", "nonfinite_steps")),
    }
    for key, value in mapping(dig(summary, "val")).items():
        row[f"val/{key}"] = num(value)
    for key, value in accel.items():
        if key != "name":
            row[f"accel.{key}"] = value
    return row


def _crashed_labels(run: RunDir) -> tuple[str | None, str | None]:
    cfg = _read_yaml(run.hydra_dir / "config.yaml") if run.hydra_dir is not None else None
    return dig(cfg, "model", "name"), dig(cfg, "accel", "name")


def read_summary(run: RunDir) -> tuple[dict[str, Any] | None, Problem | None]:
    """The run's summary, or the problem that keeps the report from using it; both for a run stopped by
    a signal (its summary is whole up to the stop) and for one that died or failed after training started
    (its summary is the one written then): only the convergence tables use those."""
    model, accel = _crashed_labels(run)
    if run.summary is None:
        why = "no summary.json: the run crashed (or is still running)"
        error = _error_line(run)
        return None, Problem(run.path, "crashed", f"{why}; log: {error}" if error else why, model, accel)
    try:
        summary = json.loads(run.summary.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        return None, Problem(run.path, "unreadable", f"{run.summary} is not readable JSON ({err})", model, accel)
    if not isinstance(summary, dict):
        return None, Problem(run.path, "unreadable", f"{run.summary} holds no JSON object", model, accel)
    status = dig(summary, "run", "status")
    model, accel = dig(summary, "run", "model") or model, dig(summary, "run", "accel") or accel
    if status == SKIPPED:  # a sweep's job the machine could not hold (drivebench.scaling): its reason
        return None, Problem(run.path, SKIPPED, str(dig(summary, "skipped", "reason") or "skipped"), model, accel)
    interrupted = dig(summary, "run", "interrupted")
    if status == INTERRUPTED and isinstance(interrupted, dict):  # stopped on purpose (drivebench.signals), not a crash
        step, scheduled = interrupted.get("step"), dig(summary, "run", "schedule_steps")
        # whether its last validation counts as its final is the convergence report's rule (validated_at_schedule_end)
        when = ("at the last step of its schedule" if isinstance(step, int) and isinstance(scheduled, int)
                and step >= scheduled else "before its schedule ended")
        return summary, Problem(run.path, INTERRUPTED,
                                f"stopped by {interrupted.get('signal') or 'a signal'} at step {step} {when}, so its "
                                f"figures cover part of the run (left out of the "
                                f"throughput tables; validation it logged counts in the convergence tables); "
                                + ("resume=auto continues it from its checkpoint" if interrupted.get("checkpoint")
                                   else "no checkpoint was written: rerun it to use it"), model, accel)
    if status == RUNNING:  # written when training started (bench/running_summary.py): the final one never came
        error = _error_line(run)
        return summary, Problem(run.path, "died",
                                "its summary still says running: the process ended during training without writing "
                                "its final one (killed: SIGKILL after a grace, the OOM killer, a lost node), or it is "
                                "still running; validation it logged counts in the convergence tables"
                                + (f"; log: {error}" if error else ""), model, accel)
    if status == FAILED:  # an error after training started; what it logged before is still a curve
        error = dig(summary, "run", "error")
        return summary, Problem(run.path, "crashed", f"status 'failed'" + (f": {error}" if error else "")
                                + "; validation it logged counts in the convergence tables", model, accel)
    if status != COMPLETED:
        return None, Problem(run.path, "crashed", f"status is {status!r}, not {COMPLETED!r}", model, accel)
    return summary, None


def _short_names(paths: list[str]) -> list[str]:
    """Each run folder relative to what all of them share (a display id, never used to group)."""
    if len(paths) == 1:
        return [Path(paths[0]).name]
    common = os.path.commonpath(paths)
    return [os.path.relpath(p, common) for p in paths]


def gpu_decode_unguarded(summary: dict[str, Any]) -> bool:
    """A camera-model run that decoded JPEGs on a GPU before the decode took a stream of its own: its summary lists
    the device decode among the numerics changes but has no ``settings.device_decode``."""
    changes = dig(summary, "settings", "numerics_changed_by") or []
    decoded = any(str(change).startswith(DECODE_CHANGE) for change in changes)
    return bool(decoded and dig(summary, "machine", "accelerator") == "cuda"
                and not dig(summary, "settings", "device_decode"))


def load_runs(dirs: list[Path | str], with_scalars: bool = True) -> RunSet:
    """Every run under ``dirs`` as a :class:`RunSet` (raises only when there is no run at all)."""
    run_dirs = find_run_dirs([Path(d) for d in dirs])
    rows, stopped, problems, warnings, scalar_frames = [], [], [], [], []
    versions: dict[Any, list[str]] = {}
    for run in run_dirs:
        summary, problem = read_summary(run)
        if problem is not None:
            problems.append(problem)
            if summary is None:
                continue
        assert summary is not None
        version = summary.get("schema_version")
        version = version if isinstance(version, (int, float, str, type(None))) else repr(version)
        versions.setdefault(version, []).append(str(run.summary))
        try:
            row = summary_row(summary, run)
        except (AttributeError, TypeError, ValueError, KeyError) as err:  # a section of an unexpected shape
            if problem is not None:  # a stopped run, listed already: its curve is all it could give
                continue
            problems.append(Problem(run.path, "unreadable", f"{run.summary} (schema_version "
                                    f"{summary.get('schema_version')!r}) has a section of an unexpected shape: "
                                    f"{type(err).__name__}: {err}", dig(summary, "run", "model"),
                                    dig(summary, "run", "accel")))
            continue
        (stopped if problem is not None else rows).append(row)
        if row["gpu_shared"]:  # a summary written before the verdict's rule says it here
            warnings.append(f"{run.path}: its GPU held {row['gpu_others_gb']:.1f} GiB beyond this run's own peak "
                            f"reservation: another process shared the GPU, so its times (and time to target) are "
                            f"not the machine's alone; it is compared only with runs that shared theirs "
                            f"(machine '..., GPU shared')")
        if row["gpu_decode_unguarded"]:
            warnings.append(f"{run.path}: decoded its JPEGs on the GPU before drivebench gave torchvision's nvJPEG "
                            f"decode a stream of its own (2026-12-06), when the decode could overwrite memory that "
                            f"queued kernels still read (wrong values, NaNs or a device-side assert: docs/accel.md): "
                            f"its losses and metrics are not evidence until it is run again")
        if with_scalars and run.event_files:
            frame, errors = read_scalars(run.event_files)
            warnings.extend(errors)
            frame.insert(0, "run_dir", str(run.path))
            scalar_frames.append(frame)
    unknown = {v: paths for v, paths in versions.items() if v not in KNOWN_SCHEMA_VERSIONS}
    for version, paths in unknown.items():
        warnings.append(f"{len(paths)} summary file(s) have schema_version {version!r} (this report reads "
                        f"{', '.join(map(str, KNOWN_SCHEMA_VERSIONS))}); read what is readable, e.g. {paths[0]}")
    names = dict(zip([r["run_dir"] for r in rows + stopped], _short_names([r["run_dir"] for r in rows + stopped])
                     if rows or stopped else []))
    runs, stopped_runs = pd.DataFrame(rows), pd.DataFrame(stopped)
    for frame in (runs, stopped_runs):
        if not frame.empty:
            frame.insert(0, "run", frame["run_dir"].map(names))
    scalars = pd.concat(scalar_frames, ignore_index=True) if scalar_frames else pd.DataFrame(
        columns=["run_dir", "phase", "tag", "step", "value", "wall_time", "elapsed_s"])
    if names and not scalars.empty:
        scalars = scalars.assign(run=scalars["run_dir"].map(names))
    return RunSet(runs=runs, scalars=scalars, problems=problems, warnings=warnings, stopped=stopped_runs)
