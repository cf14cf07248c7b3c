"""The bottleneck verdict of a run: which resource bounds the training step, the numbers that say
so, and the knob to try next (``summary.bottleneck``; the rules are listed in docs/summary.md).

Every rule and threshold lives in this module. The inputs are the summary's own figures: the
step-time split (data wait, checkpoint blocking, loop overhead, compute), the CUDA-event spans, the
system samples (NVML GPU busy, CPU of the training process and the machine, run queue, load), the
DDP per-rank figures and, with ``bench.profile``, the profile block (kernels, GPU active and idle
time by cause, aten dispatches, communication). The first rule that holds decides; the others that
also hold are listed under ``also``.
"""

from __future__ import annotations

import math
from typing import Any, Callable

DATA_LOADING = "data loading"
LAUNCH_OVERHEAD = "host launch overhead"
DEVICE_COMPUTE = "device compute"
SYNCHRONISATION = "host-device synchronisation"
CHECKPOINT_WRITES = "checkpoint writes"
COMMUNICATION = "communication"
OVERSUBSCRIPTION = "CPU oversubscription"
SHARED_GPU = "shared GPU"
UNDETERMINED = "undetermined"
VERDICTS = (SHARED_GPU, DATA_LOADING, LAUNCH_OVERHEAD, DEVICE_COMPUTE, SYNCHRONISATION, CHECKPOINT_WRITES, COMMUNICATION,
            OVERSUBSCRIPTION, UNDETERMINED)

# ---- thresholds (docs/summary.md quotes each) ------------------------------------------------------
DATA_WAIT_MIN = 0.15          # share of step time blocked in the train loader (on any rank)
PROFILE_DATA_IDLE_MIN = 0.15  # share of profiled step time the GPU idled waiting for data
CKPT_MIN = 0.10               # share of step time spent in checkpoint saves
COMM_MIN = 0.20               # share of step time in exposed communication (profile only)
RUN_QUEUE_PER_CORE = 1.25     # runnable tasks per usable core (median sample) above this: oversubscribed
LOAD_PER_CORE = 2.0           # 1-minute load per usable core above this: oversubscribed
SPREAD_MAX = 3.0              # step time p90 / p10 above this ...
SPREAD_CPU_PCT = 90.0         # ... with the machine's CPU this busy (median %): oversubscribed
SYNC_MIN = 0.20               # share of step time: profile's sync idle, or loop overhead with an idle GPU
GPU_BUSY_MIN = 70.0           # % of time a kernel runs (profile, else NVML median) below this: launch-bound
CPU_DISPATCH_OPS_MIN = 300    # CPU + profile: aten dispatches per step at least this many ...
CPU_DISPATCH_US_MAX = 50.0    # ... of at most this many microseconds each: dispatch-bound
# GiB the GPU held (NVML, every process: the median sample) beyond this run's own peak reservation, above which
# another process shares the GPU. Our process holds some memory outside PyTorch's allocator (the CUDA context,
# library handles, loaded kernels, NCCL's buffers): 0.1-1 GiB in the runs on record, so 4 GiB is well clear of it;
# the QCNet runs on record that shared an H200 showed 22-68 GiB
SHARED_GPU_GB_MIN = 4.0


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _get(data: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(data, dict):
            return None
        data = data.get(key)
    return data


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g} s"


class _Inputs:
    """The figures the rules read, taken once from a summary."""

    def __init__(self, summary: dict[str, Any]) -> None:
        train = summary.get("train") or {}
        self.phase_name = "train" if train.get("steps_measured") else "ceiling"
        self.phase = train if train.get("steps_measured") else (summary.get("ceiling") or {})
        p = self.phase
        self.steps = p.get("steps_measured") or 0
        self.on_cuda = _get(summary, "machine", "accelerator") == "cuda"
        self.cores = _num(_get(summary, "machine", "cpu_cores"))
        self.accel = _get(summary, "settings", "accel") or {}
        self.threads = _get(summary, "settings", "threads") or {}  # the thread budget as applied
        self.wall = _num(p.get("wall_s"))
        self.data = _num(p.get("data_wait_fraction")) or 0.0
        self.data_rank = None
        for r in _get(summary, "ranks", "per_rank") or []:
            share = _num(r.get("data_wait_fraction"))
            if share is not None and share > self.data:
                self.data, self.data_rank = share, r.get("rank")
        ckpt_mean, n = _num(_get(p, "ckpt_blocking_s", "mean")), _num(_get(p, "ckpt_blocking_s", "n"))
        self.ckpt = ckpt_mean * n / self.wall if ckpt_mean is not None and n and self.wall else 0.0
        self.ckpt_saves = _get(summary, "checkpoints", "saves")
        self.ckpt_async = _get(summary, "checkpoints", "async")
        self.loop = _num(p.get("loop_overhead_fraction")) or 0.0
        self.step = _get(p, "step_s") or {}
        self.compute_median = _num(_get(p, "compute_s", "median"))
        self.event_span_median = _num(_get(p, "device_compute_s", "median"))
        system = p.get("system") or {}
        self.nvml_busy = _num(_get(system, "gpu_util_pct", "median"))
        self.cpu_main = _num(_get(system, "cpu_main_pct", "median"))
        self.cpu_workers = _num(_get(system, "cpu_workers_pct", "median"))
        self.cpu_system = _num(_get(system, "cpu_system_pct", "median"))
        self.run_queue = _num(_get(system, "run_queue", "median"))
        self.load = _num(_get(system, "load_1m", "median"))
        self.profile = summary.get("profile") if (summary.get("profile") or {}).get("steps") else None
        self.world = _get(summary, "ranks", "world_size") or 1
        self.graphs_status = _get(summary, "settings", "cuda_graphs", "status")  # on | off | off: <why>
        self.gpu_others_gb = gpu_memory_of_others_gb(summary)

    # ---- derived figures
    def profile_step_s(self) -> float | None:
        return _num(_get(self.profile, "step_s", "median"))

    def gpu_busy(self) -> tuple[float | None, str]:
        """% of time a kernel runs: the profile's kernel union when there is one, else NVML."""
        active = _num(_get(self.profile, "gpu", "active_fraction"))
        if active is not None:
            return 100 * active, "profile"
        return self.nvml_busy, "NVML"

    def profile_share(self, *keys: str) -> float | None:
        value, step = _num(_get(self.profile, *keys)), self.profile_step_s()
        return value / step if value is not None and step else None


def gpu_memory_of_others_gb(summary: dict[str, Any]) -> float | None:
    """GiB the run's GPU held beyond what this run reserved at most: the median NVML sample of the device's used
    memory (every process) less ``memory.peak_device_reserved_gb`` (this process's allocator). Why: a run beside
    another process on one GPU shares its kernels' time, and NVML's busy figure counts both (QCNet `none` on an
    H200 beside a second run: 97% busy, 11.8 samples/s; alone 46% busy, 13.7 samples/s), so its step times and
    verdict are not the machine's. None where a figure is missing (the CPU, no NVML)."""
    used = _num(_get(summary, "train", "system", "gpu_mem_gb", "median"))
    ours = _num(_get(summary, "memory", "peak_device_reserved_gb"))
    # no reservation recorded (an allocator backend that keeps no such statistic, cudaMallocAsync): no judgement
    return None if used is None or not ours else used - ours


def _beyond_own(others_gb: float | None) -> bool:
    return others_gb is not None and others_gb >= SHARED_GPU_GB_MIN


def shares_gpu(summary: dict[str, Any]) -> bool:
    """Whether another process held at least ``SHARED_GPU_GB_MIN`` GiB of the run's GPU."""
    return _beyond_own(gpu_memory_of_others_gb(summary))


# ---- the rules: each returns (evidence, next) when it holds, else None -------------------------------
Rule = Callable[[_Inputs], "tuple[str, str] | None"]


def _shared_gpu(x: _Inputs) -> tuple[str, str] | None:
    if not _beyond_own(x.gpu_others_gb):
        return None
    busy = f", and its {x.nvml_busy:.0f}% busy (NVML) counts their kernels too" if x.nvml_busy is not None else ""
    return (f"the GPU held {x.gpu_others_gb:.1f} GiB beyond this run's own peak reservation (threshold "
            f"{SHARED_GPU_GB_MIN:g} GiB): another process shared it, so the step times measure both{busy}",
            "run it alone on its GPU (nvidia-smi lists the processes on it); compare times only between runs "
            "that had their GPU to themselves")


def _data_loading(x: _Inputs) -> tuple[str, str] | None:
    idle_data = x.profile_share("gpu", "idle_s_per_step", "waiting_for_data")
    if x.data < DATA_WAIT_MIN and (idle_data is None or idle_data < PROFILE_DATA_IDLE_MIN):
        return None
    if x.ckpt > x.data:
        return None  # checkpoint saves stall the step longer: that rule decides
    where = f" on rank {x.data_rank}" if x.data_rank is not None else ""
    parts = [f"the training loop waited for the loader {_pct(x.data)} of step time{where} "
             f"(threshold {_pct(DATA_WAIT_MIN)})"]
    if idle_data is not None:
        parts.append(f"the profile shows the GPU idle waiting for data {_pct(idle_data)} of the step")
    workers = x.accel.get("num_workers")
    if x.cpu_workers is not None:
        parts.append(f"loader workers used {x.cpu_workers:.0f}% CPU (median, % of one core) with "
                     f"accel.num_workers={workers}")
    if workers == 0:
        nxt = "accel.num_workers=auto (loading runs on the training thread now), or accel=max"
    elif x.cores is not None and isinstance(workers, int) and workers < x.cores - 1:
        nxt = (f"raise accel.num_workers (now {workers}, {x.cores:.0f} cores); then accel.shm_cache=true "
               "and accel.prefetch_factor")
    else:
        nxt = ("the loader has every core already: accel.shm_cache=true, accel.precompute_targets=true, "
               "or cheaper per-sample work (bench=loader measures the pipeline alone)")
    return "; ".join(parts), nxt


def _checkpoint_writes(x: _Inputs) -> tuple[str, str] | None:
    if x.ckpt < CKPT_MIN:
        return None
    evidence = (f"checkpoint saves blocked training {_pct(x.ckpt)} of step time (threshold {_pct(CKPT_MIN)})"
                + (f", {x.ckpt_saves} saves" if x.ckpt_saves is not None else ""))
    if not x.ckpt_async:
        nxt = "ckpt=async (only the copy to host memory blocks), or a larger ckpt.every_n_steps"
    else:
        nxt = "a faster ckpt.dir (compare candidates with bench=storage) or a larger ckpt.every_n_steps"
    return evidence, nxt


def _communication(x: _Inputs) -> tuple[str, str] | None:
    if x.profile is None:
        return None
    exposed = x.profile_share("gpu", "comm_exposed_s_per_step")
    source = "NCCL kernels not overlapped by compute"
    if exposed is None:
        exposed = x.profile_share("host", "comm_op_s_per_step")
        source = "host time in collective calls"
    if exposed is None or exposed < COMM_MIN:
        return None
    return (f"{source}: {_pct(exposed)} of the profiled step (threshold {_pct(COMM_MIN)}), world size {x.world}",
            "fewer all-reduces per sample: a larger model.batch_size per rank or "
            "trainer.accumulate_grad_batches; check dist.p2p and the interconnect with the doctor")


def oversubscription(x: _Inputs) -> list[str]:
    """The signs of more runnable work than cores, each with its numbers (empty: none)."""
    signs = []
    if x.cores and x.run_queue is not None and x.run_queue > RUN_QUEUE_PER_CORE * x.cores:
        signs.append(f"{x.run_queue:.0f} runnable tasks (median) on {x.cores:.0f} usable cores "
                     f"(threshold {RUN_QUEUE_PER_CORE:g} per core)")
    if x.cores and x.load is not None and x.load > LOAD_PER_CORE * x.cores:
        signs.append(f"1-minute load {x.load:.1f} on {x.cores:.0f} cores (threshold {LOAD_PER_CORE:g} per core)")
    p10, p90 = _num(x.step.get("p10")), _num(x.step.get("p90"))
    if p10 and p90 and p90 / p10 > SPREAD_MAX and x.cpu_system is not None and x.cpu_system >= SPREAD_CPU_PCT:
        signs.append(f"step time p10-p90 {p10:.3g}-{p90:.3g} s ({p90 / p10:.1f}x, threshold {SPREAD_MAX:g}x) "
                     f"with the machine's CPU {x.cpu_system:.0f}% busy")
    return signs


def _oversubscribed(x: _Inputs) -> tuple[str, str] | None:
    signs = oversubscription(x)
    if not signs:
        return None
    budget = x.threads
    evidence = ("the machine is oversubscribed, so the step's compute figures measure waiting for a core: "
                + "; ".join(signs))
    if budget.get("fits") and budget.get("knob") != "default":  # within its budget: the other processes crowd it
        return evidence, (f"stop the other processes on this machine: this run's threads fit its cores "
                          f"({budget.get('note')}); or a lower accel.threads")
    if budget.get("knob") == "default":
        knob = f"accel.threads=auto (now PyTorch's defaults: {budget.get('note')})"
    elif budget:
        knob = f"accel.threads=auto / fewer workers ({budget.get('note')})"
    elif "threads" in x.accel:  # the thread budget knob (issue 24), as resolved
        knob = f"accel.threads=auto (now {x.accel['threads']}: torch threads + loader workers within the usable cores)"
    else:
        knob = "fewer torch threads (OMP_NUM_THREADS, torch.set_num_threads) so that they and the loader workers fit the usable cores"
    return evidence, (f"{knob}, fewer accel.num_workers (now {x.accel.get('num_workers')}), or stop the other "
                      "processes on this machine")


def _synchronisation(x: _Inputs) -> tuple[str, str] | None:
    if not x.on_cuda:
        return None
    sync_idle = x.profile_share("gpu", "idle_s_per_step", "synchronisation")
    busy, source = x.gpu_busy()
    if sync_idle is not None:
        if sync_idle < SYNC_MIN:
            return None
        calls = _num(_get(x.profile, "host", "sync_calls_per_step"))
        evidence = (f"the profile shows the GPU idle after host synchronisations {_pct(sync_idle)} of the step "
                    f"(threshold {_pct(SYNC_MIN)}), {calls:.0f} synchronising calls per step")
    elif x.loop >= SYNC_MIN and busy is not None and busy < GPU_BUSY_MIN:
        evidence = (f"the host waited between steps {_pct(x.loop)} of step time (loop overhead, threshold "
                    f"{_pct(SYNC_MIN)}) while the GPU was busy only {busy:.0f}% ({source})")
    else:
        return None
    return evidence, ("remove host read-backs from the step (.item(), .cpu(), printing or branching on "
                      "tensor values), raise trainer.log_every_n_steps; bench.profile=10 lists the calls")


def _launch_overhead(x: _Inputs) -> tuple[str, str] | None:
    if x.on_cuda:
        busy, source = x.gpu_busy()
        if busy is None or busy >= GPU_BUSY_MIN:
            return None
        parts = [f"kernels ran only {busy:.0f}% of the time ({source}, threshold {GPU_BUSY_MIN:.0f}%) while the "
                 f"data wait was {_pct(x.data)} of step time"]
        if x.cpu_main is not None:
            parts.append(f"the training process used {x.cpu_main:.0f}% of one core")
        if x.profile is not None:
            kernels = _num(_get(x.profile, "gpu", "kernels_per_step"))
            host_idle = x.profile_share("gpu", "idle_s_per_step", "waiting_for_host")
            if kernels is not None:
                parts.append(f"{kernels:.0f} kernels per step")
            if host_idle is not None:
                parts.append(f"GPU idle waiting for the host {_pct(host_idle)} of the step")
        if x.event_span_median is not None and x.compute_median:
            parts.append(f"CUDA-event span {_s(x.event_span_median)} vs host compute {_s(x.compute_median)} "
                         "(the device keeps pace with the host: it waits for launches)")
        return "; ".join(parts), _launch_next(x)
    if x.profile is None:
        return None
    ops = _num(_get(x.profile, "host", "aten_ops_per_step"))
    aten_s = _num(_get(x.profile, "host", "aten_op_s_per_step"))
    if not ops or aten_s is None:
        return None
    per_op_us = 1e6 * aten_s / ops
    if ops < CPU_DISPATCH_OPS_MIN or per_op_us > CPU_DISPATCH_US_MAX:
        return None
    return (f"the CPU dispatches {ops:.0f} aten ops per step at {per_op_us:.0f} us each (thresholds "
            f">= {CPU_DISPATCH_OPS_MIN} ops, <= {CPU_DISPATCH_US_MAX:.0f} us): per-op overhead, not arithmetic",
            "fewer, larger ops: batch the small ones (vectorise loops over agents/layers), accel.compile=true; "
            "on a GPU the same model is launch-bound")


def _launch_next(x: _Inputs) -> str:
    status = str(x.graphs_status or x.accel.get("cuda_graphs") or "")
    if status == "off" and "cuda_graphs" in x.accel:
        return "accel.cuda_graphs=on (replay the step as CUDA graphs), then a larger model.batch_size"
    if status.startswith("off:"):  # auto turned them off: say why rather than suggest them
        compile_too = "" if x.accel.get("compile") else ", accel.compile=true"  # not to a run that compiled
        return f"a larger model.batch_size (more work per launch){compile_too}; CUDA graphs are {status}"
    if not x.accel.get("compile"):
        return "accel.compile=true (fewer, fused kernels), then a larger model.batch_size (more work per launch)"
    return "a larger model.batch_size (more work per launch); CUDA graphs for the step (accel.cuda_graphs)"


def _device_compute(x: _Inputs) -> tuple[str, str] | None:
    if x.on_cuda:
        busy, source = x.gpu_busy()
        evidence = (f"kernels ran {busy:.0f}% of the time ({source}); data wait {_pct(x.data)}, loop overhead "
                    f"{_pct(x.loop)} of step time" if busy is not None else
                    f"no GPU-busy figure (no NVML, no profile); data wait {_pct(x.data)}, loop overhead {_pct(x.loop)}")
        precision = str(x.accel.get("precision", ""))
        if precision.startswith("32"):
            nxt = "accel.precision=bf16-mixed (or accel=max), accel.compile=true"
        elif not x.accel.get("compile"):
            nxt = "accel.compile=true (fused kernels)"
        else:
            nxt = "the GPU is the bottleneck, as it should be: a larger GPU, or a lighter model configuration"
        return evidence, nxt
    evidence = (f"the CPU computes the model: data wait {_pct(x.data)}, loop overhead {_pct(x.loop)} of step "
                f"time" + (f", the training process at {x.cpu_main:.0f}% of one core" if x.cpu_main is not None else ""))
    return evidence, "a GPU; on the CPU, torch threads on the free cores (accel.threads)"


# first: on a shared GPU or an oversubscribed machine every other figure measures the other work as well
RULES: tuple[tuple[str, Rule], ...] = (
    (SHARED_GPU, _shared_gpu),
    (OVERSUBSCRIPTION, _oversubscribed),
    (DATA_LOADING, _data_loading),
    (CHECKPOINT_WRITES, _checkpoint_writes),
    (COMMUNICATION, _communication),
    (SYNCHRONISATION, _synchronisation),
    (LAUNCH_OVERHEAD, _launch_overhead),
    (DEVICE_COMPUTE, _device_compute),
)


def findings(summary: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Every rule that holds, in rule order, as (verdict, evidence, next); device compute, the
    fallback, always holds last."""
    x = _Inputs(summary)
    found = []
    for verdict, rule in RULES:
        result = rule(x)
        if result is not None:
            found.append((verdict, *result))
    return found


def diagnose(summary: dict[str, Any]) -> dict[str, Any]:
    """``{verdict, evidence, next, phase, also}`` of a summary (see the module docstring)."""
    bench = _get(summary, "run", "bench")
    x = _Inputs(summary)
    if not x.steps or not x.wall:
        no_training = bench in ("loader", "storage", "autotune")
        why = (f"bench={bench} times no training step" if no_training
               else "no measured step (raise bench.steps or trainer.max_steps)")
        nxt = ("bench=train (accel=auto trains with the trial's choice)" if bench == "autotune"
               else "bench=train with measured steps")
        return {"verdict": UNDETERMINED, "evidence": why, "next": nxt,
                "phase": None, "also": []}
    found = findings(summary)
    verdict, evidence, nxt = found[0]
    if x.phase_name == "ceiling":
        evidence = "ceiling phase (one resident batch, no loader): " + evidence
    return {"verdict": verdict, "evidence": evidence, "next": nxt, "phase": x.phase_name,
            "also": [f"{v}: {e}" for v, e, _ in found[1:] if v != DEVICE_COMPUTE]}


def resident_batch_ratio(summary: dict[str, Any]) -> float | None:
    """The ceiling's batch elements over training's median batch elements (None: not recorded)."""
    train = _num(((summary.get("train") or {}).get("batch_elements") or {}).get("median"))
    ceiling = _num(((summary.get("ceiling") or {}).get("batch_elements") or {}).get("median"))
    return ceiling / train if train and ceiling else None


def efficiency_note(summary: dict[str, Any]) -> str | None:
    """Why training outran its own ceiling, when ``efficiency`` > 100% (None otherwise)."""
    efficiency = _num(summary.get("efficiency"))
    if efficiency is None or efficiency <= 1.0:
        return None
    train = _Inputs({**summary, "ceiling": None})
    ceiling = _Inputs({**summary, "train": None})
    reasons = []
    for name, x in (("training", train), ("the ceiling", ceiling)):
        signs = oversubscription(x)
        if signs:
            reasons.append(f"the machine was oversubscribed during {name} ({'; '.join(signs)})")
    t_med, c_med = _num(train.step.get("median")), _num(ceiling.step.get("median"))
    c_p10, c_p90 = _num(ceiling.step.get("p10")), _num(ceiling.step.get("p90"))
    heavier = resident_batch_ratio(summary)
    if heavier is not None and heavier > 1.05:
        reasons.append(f"the ceiling's one resident batch holds {heavier:.2f}x the tensor elements of training's "
                       "median batch (this model's batches vary in size: agents, map elements), so each of its "
                       "steps does more work than a typical training step")
    if ceiling.steps and ceiling.steps < 10:
        reasons.append(f"the ceiling measured only {ceiling.steps} steps")
    if c_p10 and c_p90 and t_med and c_p10 <= t_med <= c_p90:
        reasons.append(f"training's median step {t_med:.3g} s lies within the ceiling's p10-p90 "
                       f"{c_p10:.3g}-{c_p90:.3g} s: the difference is noise")
    if not reasons:
        reasons.append(f"the ceiling's one resident batch stepped slower (median {_s(c_med)}) than training "
                       f"(median {_s(t_med)}); machine CPU {train.cpu_system or 0:.0f}% during training, "
                       f"{ceiling.cpu_system or 0:.0f}% during the ceiling: the phases ran under different conditions")
    return f"above 100%: {'; '.join(reasons)}"
