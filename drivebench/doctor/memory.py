"""Family 4: CPU cores for the loader, shared memory for its batches and caches, pinned memory.

Loader workers hand every batch to the training process through /dev/shm; each worker keeps
``prefetch_factor`` batches there. Docker's default /dev/shm is 64 MB, so a loader with a few
workers dies with "bus error" / "DataLoader worker killed" on the first batches. The shared-memory
sample cache (``accel.shm_cache``) lives there too; when it does not fit the run goes uncached.
"""

from __future__ import annotations

import math
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from drivebench.doctor.context import DoctorContext
from drivebench.doctor.probe import error_text, gib, try_import
from drivebench.doctor.result import Check, CheckResult, failed, informed, passed, warned

SHM_PATH = "/dev/shm"
TORCH_DEFAULT_PREFETCH = 2
DEFAULT_SAMPLE_BYTES = 16 * 2**20  # a six-camera float sample at 256x704 is ~13 MB; a motion scene far less
MAX_CACHE_FILES_SCANNED = 200_000
PINNED_TEST_BYTES = 256 * 2**20
RUN_QUEUE_SAMPLES = 5
RUN_QUEUE_INTERVAL_S = 0.1


def shm_usage() -> tuple[int, int] | None:
    """``(total, free)`` bytes of /dev/shm, or None where there is none (tests replace this)."""
    try:
        usage = shutil.disk_usage(SHM_PATH)
    except OSError:
        return None
    return usage.total, usage.free


def cpu_cores(ctx: DoctorContext) -> CheckResult:
    """CPU cores per GPU against the resolved accel.num_workers (loader workers per training process)."""
    machine, accel = ctx.machine, ctx.accel
    per_device = machine.cores_per_device
    workers = accel.num_workers
    where = f"{machine.num_devices} GPU(s)" if machine.accelerator == "cuda" else "the CPU"
    saw = (f"{machine.cpu_cores} usable cores for {where} ({per_device} per device); accel={accel.name} resolves "
           f"num_workers={workers}, preprocess_workers={accel.preprocess_workers}")
    data = {"cpu_cores": machine.cpu_cores, "devices": machine.num_devices, "cores_per_device": per_device,
            "num_workers": workers, "preprocess_workers": accel.preprocess_workers}
    if workers > per_device:
        return warned(saw + ": more loader workers than cores per device, so workers and training compete",
                      f"accel.num_workers={per_device} (or auto)", data)
    if workers == 0 and machine.accelerator == "cuda" and accel.name != "none":
        return warned(saw + ": batches are loaded in the training process while the GPU waits",
                      "accel.num_workers=auto (one worker per core of each device, at most 16)", data)
    return passed(saw, data)


def training_processes(ctx: DoctorContext) -> int:
    """Training processes the run starts on this machine (DDP ranks per node), which share its cores."""
    from drivebench.dist import resolve_devices

    try:
        return resolve_devices(ctx.cfg.dist, len(ctx.machine.gpus), "gpu" if ctx.machine.accelerator == "cuda" else "cpu")
    except Exception:  # dist.devices that the launcher checks report on their own
        return ctx.machine.num_devices


def default_threads() -> dict[str, int | None]:
    """PyTorch's and the BLAS libraries' thread counts in this process: the defaults of this
    environment (``OMP_NUM_THREADS`` and friends included), since the doctor sets none (tests replace this)."""
    from drivebench.accel.threads import in_effect

    return in_effect()


def threads(ctx: DoctorContext) -> CheckResult:
    """What PyTorch's default threads do on this machine beside the loader workers, and the run's thread budget."""
    from drivebench.accel.threads import ThreadBudget
    from drivebench.perf.system import read_run_queue

    machine, accel = ctx.machine, ctx.accel
    knob = ctx.select("accel.threads", "default")
    processes = training_processes(ctx)
    cores = max(machine.cpu_cores // processes, 1)
    defaults = default_threads()
    intra, blas = defaults["torch_intra_op"], defaults["blas"]
    workers = accel.num_workers
    default_total = (intra or 1) + workers
    env = {k: os.environ[k] for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS") if k in os.environ}
    samples = []
    for _ in range(RUN_QUEUE_SAMPLES):  # one reading is a moment; the median of a few is the load now
        samples.append(read_run_queue())
        time.sleep(RUN_QUEUE_INTERVAL_S)
    queue = sorted(r for r, _ in samples if r is not None)
    runnable, load = (queue[len(queue) // 2] if queue else None), samples[-1][1]
    load = load if load is not None else float("nan")
    saw = (f"{cores} usable cores per training process ({machine.cpu_cores_source}); PyTorch's defaults here: "
           f"{intra} intra-op threads per process (BLAS {blas}; {', '.join(f'{k}={v}' for k, v in env.items()) or 'no OMP/MKL/OPENBLAS_NUM_THREADS set'})"
           f", so with accel={accel.name}'s {workers} loader workers {default_total} threads on {cores} cores")
    budget = ThreadBudget.plan(knob, machine.cpu_cores, machine.cpu_cores_source, processes, workers,
                               accel.preprocess_workers)
    record = budget.to_dict()
    data = {"cores": cores, "cores_source": machine.cpu_cores_source, "default_threads": defaults, "env": env,
            "loader_workers": workers, "run_queue": runnable, "load_1m": load, "budget": record}
    busy = runnable is not None and runnable > cores
    if busy:
        saw += f"; {runnable} runnable tasks on the machine now (1-minute load {load:.1f}): other processes use the cores"
    if budget.active:
        saw += f"; this run: accel.threads={knob} -> {record['note']}"
        if record["fits"] is False:
            fix = "accel.num_workers=" + str(max(cores - 1, 0)) if budget.loader_workers >= cores else "accel.threads=auto"
            return warned(saw, f"{fix} (training threads + loader workers within the {cores} usable cores)", data)
        left = max(cores - (runnable or 0) - workers, 1)
        if busy and (budget.training_threads or 1) > left:
            return warned(saw + f": other processes take cores the run's {budget.training_threads} OpenMP threads "
                          "wait for at every op's barrier",
                          f"accel.threads={left} (the cores the other processes leave now), or stop them", data)
        return passed(saw, data)
    over = [why for why, holds in (
        (f"{intra} intra-op threads exceed the {cores} usable cores (PyTorch counts the host's CPUs, not the "
         "affinity or cgroup quota)", (intra or 0) > cores),
        (f"{default_total} threads with the loader workers on {cores} cores", default_total > cores),
        ("another busy process takes a core from PyTorch's OpenMP threads, which then wait at every op's barrier "
         "(issue 24: 37.3 s per step instead of 1.33 s)", busy and (intra or 1) > 1)) if holds]
    saw += "; this run keeps PyTorch's defaults (accel.threads=default)"
    if not over:
        return passed(saw, data)
    auto = ThreadBudget.plan("auto", machine.cpu_cores, machine.cpu_cores_source, processes, workers,
                             accel.preprocess_workers)
    remedy = f"accel.threads=auto ({auto.note()})"
    if busy:  # auto counts this run's cores, not other processes' load: leave them the cores they use now
        left = max(cores - (runnable or 0) - workers, 1)
        if left < (auto.training_threads or 1):
            remedy = (f"accel.threads={left} (the cores the other processes leave now, beside "
                      f"{workers} loader workers), or stop them; accel.threads=auto once they are gone")
    return warned(saw + ": " + "; ".join(over), remedy, data)


@dataclass
class Footprint:
    """What the configured data puts in /dev/shm: per sample in flight, and for the sample caches."""

    sample_bytes: float
    sample_how: str
    rough: bool = False            # only the order of magnitude is known (images at the source resolution)
    cache_bytes: float | None = None
    cache_how: str = "unknown until the first run preprocesses"


def _preprocessed_cache(ctx: DoctorContext) -> tuple[int, int, Path | None]:
    """``(files, bytes, dir)`` of the one-time preprocessing cache the run reads samples from."""
    root = ctx.data_location().cache_dir
    if root is None or not root.is_dir():
        return 0, 0, root
    files = total = 0
    for dirpath, _, names in os.walk(root):
        for name in names:
            if name.endswith(".pkl"):
                try:
                    total += os.stat(os.path.join(dirpath, name)).st_size
                except OSError:
                    continue
                files += 1
                if files >= MAX_CACHE_FILES_SCANNED:
                    return files, total, root
    return files, total, root


def _camera_images(root: Path | None) -> tuple[int, int, int, int] | None:
    """``(cameras, images, height, width)`` of a nuScenes-layout dataset (``samples/CAM_*``), else None."""
    samples = root / "samples" if root is not None else None
    if samples is None or not samples.is_dir():
        return None
    cameras = sorted(d for d in samples.iterdir() if d.is_dir() and d.name.startswith("CAM"))
    images = [f for cam in cameras for f in cam.iterdir() if f.suffix.lower() in (".jpg", ".jpeg", ".png")]
    if not images:
        return None
    try:
        from PIL import Image

        with Image.open(images[0]) as first:  # reads the header only
            width, height = first.size
    except Exception:
        return None
    return len(cameras), len(images), height, width


def estimate_footprint(ctx: DoctorContext) -> Footprint:
    """Bytes per sample in flight and of the shared-memory caches, from what is on disk."""
    files, pkl_bytes, cache_dir = _preprocessed_cache(ctx)
    cameras = _camera_images(ctx.data_location().root)
    cache_parts, cache_how = [], []
    if files:
        cache_parts.append(pkl_bytes)
        cache_how.append(f"{files} preprocessed samples in {cache_dir}")
    if cameras is not None:
        n_cams, n_images, height, width = cameras
        per_sample = n_cams * 3 * height * width * 4  # float32 images at the source resolution
        cache_parts.append(n_images * 3 * height * width)  # every image decoded once, uint8
        cache_how.append(f"{n_images} images decoded at {width}x{height}")
        footprint = Footprint(per_sample, f"{gib(per_sample)}/sample ({n_cams} cameras x {width}x{height} float32 "
                                          "at the source resolution: rough, the model's resize changes it)",
                              rough=True)
    elif files:
        mean = pkl_bytes / files
        footprint = Footprint(mean, f"{gib(mean)}/sample (mean of {files} preprocessed, pre-transform samples in "
                                    f"{cache_dir})")
    else:
        footprint = Footprint(DEFAULT_SAMPLE_BYTES, f"{gib(DEFAULT_SAMPLE_BYTES)}/sample (assumed: no preprocessed "
                                                    f"samples yet in {cache_dir})")
    if cache_parts:
        footprint.cache_bytes = float(sum(cache_parts))
        footprint.cache_how = " + ".join(cache_how) + ", all splits: an upper bound"
    return footprint


def shm_space(ctx: DoctorContext) -> CheckResult:
    """/dev/shm size against the loaders' in-flight batches and the shared-memory sample cache."""
    usage = shm_usage()
    if usage is None:
        return informed(f"no {SHM_PATH} on this system: loader workers share batches another way")
    total, free = usage
    accel = ctx.accel
    batch = int(ctx.select("model.batch_size", 1) or 1)
    prefetch = accel.prefetch_factor or TORCH_DEFAULT_PREFETCH
    foot = estimate_footprint(ctx)
    loader_need = accel.num_workers * prefetch * batch * foot.sample_bytes
    cache_need = (foot.cache_bytes or 0.0) if accel.shm_cache else 0.0
    data = {"shm_total": total, "shm_free": free, "num_workers": accel.num_workers, "prefetch_factor": prefetch,
            "batch_size": batch, "sample_bytes": foot.sample_bytes, "sample_estimate_rough": foot.rough,
            "loader_bytes": loader_need, "shm_cache": accel.shm_cache, "cache_bytes": foot.cache_bytes}
    saw = (f"{SHM_PATH} {gib(total)} ({gib(free)} free); in-flight batches need {gib(loader_need)} = "
           f"{accel.num_workers} worker(s) x {prefetch} batches x {batch} samples x {foot.sample_how}")
    if accel.shm_cache:
        saw += (f"; the shared-memory caches need up to {gib(foot.cache_bytes)} ({foot.cache_how})"
                if foot.cache_bytes is not None else f"; the shared-memory cache size is {foot.cache_how}")
    suggest = f"{max(1, math.ceil((loader_need + cache_need) * 1.5 / 2**30))}g"
    grow = (f"give it more shared memory: `docker run --shm-size={suggest}` (Kubernetes: an emptyDir with "
            f"medium: Memory at {SHM_PATH}) or `mount -o remount,size={suggest} {SHM_PATH}`")
    fewer = "or lower accel.num_workers / accel.prefetch_factor"
    if loader_need > free:
        if foot.rough:
            return warned(saw + ": may not fit (a rough estimate)", f"{grow}; {fewer}", data)
        return failed(saw + ": loader workers would die with 'bus error'", f"{grow}; {fewer}", data)
    if accel.shm_cache and foot.cache_bytes is not None:
        budget = min(accel.shm_cache_max_gb * 2**30, free - loader_need)
        if cache_need > budget:
            return warned(saw + f": more than the cache budget of {gib(budget)}, so the run may go uncached",
                          f"{grow}; or set accel.shm_cache=false (or raise accel.shm_cache_max_gb if room is left)",
                          data)
    return passed(saw, data)


def pinned_memory(ctx: DoctorContext) -> CheckResult:
    """Page-locked (pinned) host memory can be allocated and freed (what pin_memory=True uses)."""
    torch, err = try_import("torch")
    if torch is None:
        return failed(f"torch does not import: {err}", "reinstall torch")
    if not torch.cuda.is_available():
        return informed("no CUDA device: pinned memory is not used (accel.pin_memory resolves to false)")
    try:
        started = time.perf_counter()
        buf = torch.empty(PINNED_TEST_BYTES, dtype=torch.uint8, pin_memory=True)
        pinned = buf.is_pinned()
        del buf
        seconds = time.perf_counter() - started
    except Exception as err:
        remedy = ("raise the locked-memory limit (`ulimit -l unlimited`, docker `--ulimit memlock=-1`) or set "
                  "accel.pin_memory=false")
        make = failed if ctx.accel.pin_memory else warned
        return make(f"pinning {gib(PINNED_TEST_BYTES)} failed: {error_text(err)}", remedy,
                    {"pin_memory": ctx.accel.pin_memory})
    data = {"bytes": PINNED_TEST_BYTES, "seconds": seconds, "pin_memory": ctx.accel.pin_memory}
    if not pinned:
        return warned("the allocation succeeded but is not page-locked", "set accel.pin_memory=false", data)
    return passed(f"pinned and freed {gib(PINNED_TEST_BYTES)} in {seconds * 1e3:.0f} ms "
                  f"(accel.pin_memory={ctx.accel.pin_memory})", data)


CHECKS = [
    Check("memory.cpu_cores", cpu_cores),
    Check("memory.threads", threads),
    Check("memory.shm", shm_space),
    Check("memory.pinned", pinned_memory),
]
