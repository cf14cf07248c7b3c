"""``bench.profile=<steps>``: ``torch.profiler`` over that many training steps, right after warm-up.

A Lightning callback drives one ``torch.profiler.profile`` with PyTorch's own schedule: the
``bench.warmup_steps`` are skipped, one step warms the profiler up (its first step carries
set-up costs, as PyTorch's docs advise), then ``steps`` steps are recorded and written as a
Chrome/Perfetto trace (PyTorch's ``export_chrome_trace``), gzipped, into ``<run dir>/tb/profile/rank<N>.pt.trace.json.gz`` (Perfetto
and chrome://tracing open it; TensorBoard's PyTorch profiler plugin finds it under ``tb/``).
Activities: CPU always, CUDA when the module is on a CUDA device.

The profiled steps (profiler warm-up included) carry the profiler's overhead, so the step timer
flags them and keeps them out of the run's statistics, like warm-up. After training,
:meth:`ProfileSteps.summarise` reads the trace back (:mod:`drivebench.perf.trace_analysis`), sets
its figures beside the CUDA-event spans and NVML samples of the same steps, and logs them to
TensorBoard under ``profile/``.

This callback must come before the :class:`~drivebench.perf.callback.StepTimer` in the callback
list: stopping the trace (the profiler then collects its events, host time) and writing it happen in
the last profiled step's batch-end hook, and so fall into that excluded step rather than into the first
measured one. Written there, not after training: a run stopped later (a time limit, SIGTERM) keeps its
trace and the summary its ``profile`` block. SparseDrive's trace took longer to write than the 20 s a
benchmark's cap left after training (experiments/results/h100-2026-12-07-b59), and a cut export leaves a
truncated file, so the file is written under a temporary name and renamed when complete.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from torch.profiler import ProfilerActivity

from drivebench.perf.callback import PhaseTimes
from drivebench.perf.stats import describe
from drivebench.perf.system import SystemMonitor
from drivebench.perf.trace_analysis import analyse_trace, load_trace

PROFILER_WARMUP_STEPS = 1
TRACE_SUBDIR = Path("tb") / "profile"


class ProfileSteps(pl.Callback):
    """Profile ``steps`` training steps after ``warmup_steps``; see the module docstring.

    Args:
        steps: steps recorded (>= 1).
        warmup_steps: the bench's warm-up steps, skipped before the profiler's own warm-up step.
        run_dir: the run directory; the trace goes under ``tb/profile/``.
        top_k: kernels and operators listed in the summary.
    """

    def __init__(self, steps: int, warmup_steps: int, run_dir: Path | str, top_k: int = 10) -> None:
        if steps < 1:
            raise ValueError(f"profile steps must be >= 1, got {steps}")
        self.steps = steps
        self.warmup_steps = warmup_steps
        self.trace_dir = Path(run_dir) / TRACE_SUBDIR
        self.top_k = top_k
        self.trace_path: Path | None = None
        self.export_s: float | None = None
        self.activities: list[str] = []
        self._prof: torch.profiler.profile | None = None
        self._rank = 0
        self._n_steps = 0
        self._t_recorded: list[float] = []  # perf_counter at the start and the end of the recorded steps

    @property
    def occupied_steps(self) -> int:
        """Steps run under the profiler (its warm-up step included): the step timer excludes them."""
        return PROFILER_WARMUP_STEPS + self.steps

    @property
    def first_recorded_step(self) -> int:
        return self.warmup_steps + PROFILER_WARMUP_STEPS

    # ---- lifecycle ---------------------------------------------------------------------------
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._rank = trainer.global_rank
        activities = [ProfilerActivity.CPU]
        if pl_module.device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        else:  # a CUDA build without a GPU: Kineto logs "ERROR ... gpuGetDeviceCount failed" for nothing
            os.environ.setdefault("KINETO_LOG_LEVEL", "5")
        self.activities = [a.name for a in activities]
        schedule = torch.profiler.schedule(skip_first=self.warmup_steps, wait=0, warmup=PROFILER_WARMUP_STEPS,
                                           active=self.steps, repeat=1)
        self._prof = torch.profiler.profile(activities=activities, schedule=schedule, on_trace_ready=self._ready)
        self._prof.start()

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self._prof is None:
            return
        self._n_steps += 1
        if self._n_steps in (self.first_recorded_step, self.first_recorded_step + self.steps):
            self._t_recorded.append(time.perf_counter())  # the recorded steps begin / end here
        self._prof.step()  # the last recorded step's step() stops the trace and writes it (``_ready``)
        if self._n_steps >= self.first_recorded_step + self.steps:
            self._stop()

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._prof is not None and len(self._t_recorded) == 1:
            self._t_recorded.append(time.perf_counter())  # training ended inside the window
        self._stop()  # a window cut short by the end of training is still written

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._stop()

    def _stop(self) -> None:
        prof, self._prof = self._prof, None
        if prof is not None:
            prof.stop()

    def _ready(self, prof: torch.profiler.profile) -> None:
        """The window ended (or training did inside it), on every rank: write its trace now."""
        t0 = time.perf_counter()
        self.trace_dir.mkdir(parents=True, exist_ok=True)
        path = self.trace_dir / f"rank{self._rank}.pt.trace.json.gz"
        partial = path.with_name(f".{path.name}")  # torch gzips for a .gz name; renamed once whole
        prof.export_chrome_trace(str(partial))
        partial.replace(path)
        self.trace_path = path
        self.export_s = time.perf_counter() - t0

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._stop()  # a profiler still open (an exception before on_train_end) is closed

    # ---- after training ----------------------------------------------------------------------
    def summarise(self, times: PhaseTimes, monitor: SystemMonitor | None = None, logger: Any = None,
                  step: int = 0) -> dict[str, Any]:
        """The summary's ``profile`` block (docs/summary.md), also logged under ``profile/``."""
        head: dict[str, Any] = {
            "requested_steps": self.steps,
            "first_step": self.first_recorded_step,
            "activities": self.activities,
        }
        if self.trace_path is None or not self.trace_path.exists():
            head["note"] = (f"no trace: training ran {len(times.records)} steps, and the profile window needs "
                            f"{self.warmup_steps} warm-up + {self.occupied_steps} (profiler warm-up + "
                            f"bench.profile) steps; raise trainer.max_steps or lower bench.warmup_steps")
            return head
        recorded = min(self.steps, max(len(times.records) - self.first_recorded_step, 0))
        block = {**head, "trace": str(self.trace_path), "trace_bytes": self.trace_path.stat().st_size,
                 "export_s": self.export_s, **analyse_trace(load_trace(self.trace_path), self.top_k, recorded)}
        block["compare"] = self._compare(block, times, monitor)
        if logger:
            logger.log_metrics(scalars(block), step=step)
        return block

    def _compare(self, block: dict[str, Any], times: PhaseTimes, monitor: SystemMonitor | None) -> dict[str, Any]:
        """The same recorded steps seen by the step timer, its CUDA events and NVML."""
        first = self.first_recorded_step
        recorded = [r for r in times.records[first:first + self.steps] if r.profiled]
        measured = times.measured()
        traced, plain = _num(_get(block, "step_s", "median")), describe(r.step_s for r in measured)["median"]
        out: dict[str, Any] = {
            "measured_step_s_median": plain if measured else None,
            "profiled_over_measured_step_time": traced / plain if traced and measured and plain > 0 else None,
        }
        spans = [r.device_compute_s for r in recorded if r.device_compute_s is not None]
        out["cuda_event_span_s_median"] = describe(spans)["median"] if spans else None
        gpu = block.get("gpu")
        out["profile_gpu_active_s_per_step"] = gpu["active_s_per_step"] if gpu else None
        out["profile_gpu_active_pct"] = 100 * gpu["active_fraction"] if gpu and gpu["active_fraction"] is not None else None
        nvml = None
        if monitor is not None and len(self._t_recorded) == 2:
            samples = [s.gpu_util_pct for s in monitor.window(*self._t_recorded) if s.gpu_util_pct is not None]
            nvml = describe(samples)["median"] if samples else None
        out["nvml_gpu_busy_pct_median"] = nvml
        return out


def _get(data: Any, *keys: str) -> Any:
    for key in keys:
        data = data.get(key) if isinstance(data, dict) else None
    return data


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def scalars(block: dict[str, Any]) -> dict[str, float]:
    """The profile block's per-step figures as TensorBoard scalars (``profile/*``)."""
    out: dict[str, float] = {}
    for key in ("aten_ops_per_step", "aten_op_s_per_step", "outside_ops_s_per_step", "launch_calls_per_step",
                "sync_calls_per_step"):
        value = (block.get("host") or {}).get(key)
        if value is not None:
            out[f"profile/{key}"] = float(value)
    gpu = block.get("gpu") or {}
    for key in ("kernels_per_step", "active_s_per_step", "memcpy_memset_s_per_step", "comm_exposed_s_per_step"):
        if gpu.get(key) is not None:
            out[f"profile/gpu_{key}"] = float(gpu[key])
    for key, value in (gpu.get("idle_s_per_step") or {}).items():
        out[f"profile/gpu_idle_{key}_s_per_step"] = float(value)
    return out
