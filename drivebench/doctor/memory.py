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
from pathlib import Path

from drivebench.doctor.context import DoctorContext
from drivebench.doctor.probe import error_text, gib, try_import
from drivebench.doctor.result import Check, CheckResult, failed, informed, passed, warned

SHM_PATH = "/dev/shm"
TORCH_DEFAULT_PREFETCH = 2
DEFAULT_SAMPLE_BYTES = 16 * 2**20  # a six-camera float sample at 256x704 is ~13 MB; a motion scene far less
MAX_CACHE_FILES_SCANNED = 200_000
PINNED_TEST_BYTES = 256 * 2**20


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


def _preprocessed_cache(ctx: DoctorContext) -> tuple[int, int, Path | None]:
    """``(files, bytes, dir)`` of the one-time preprocessing cache the run reads samples from."""
    location = ctx.data_location()
    root = location.cache_dir
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


def shm_space(ctx: DoctorContext) -> CheckResult:
    """/dev/shm size against the loaders' in-flight batches and the shared-memory sample cache."""
    usage = shm_usage()
    if usage is None:
        return informed(f"no {SHM_PATH} on this system: loader workers share batches another way")
    total, free = usage
    accel = ctx.accel
    batch = int(ctx.select("model.batch_size", 1) or 1)
    prefetch = accel.prefetch_factor or TORCH_DEFAULT_PREFETCH
    files, cache_bytes, cache_dir = _preprocessed_cache(ctx)
    sample_bytes = cache_bytes / files if files else DEFAULT_SAMPLE_BYTES
    sample_how = (f"{gib(sample_bytes)}/sample (mean of {files} preprocessed, pre-transform samples in {cache_dir})"
                  if files else f"{gib(sample_bytes)}/sample (assumed: no preprocessed samples yet in {cache_dir})")
    loader_need = accel.num_workers * prefetch * batch * sample_bytes
    data = {"shm_total": total, "shm_free": free, "num_workers": accel.num_workers, "prefetch_factor": prefetch,
            "batch_size": batch, "sample_bytes": sample_bytes, "loader_bytes": loader_need,
            "shm_cache": accel.shm_cache, "cache_bytes": cache_bytes if files else None}
    saw = (f"{SHM_PATH} {gib(total)} ({gib(free)} free); in-flight batches need {gib(loader_need)} = "
           f"{accel.num_workers} worker(s) x {prefetch} batches x {batch} samples x {sample_how}")
    if accel.shm_cache:
        saw += (f"; the shared-memory sample cache needs up to {gib(cache_bytes)} (all preprocessed samples)"
                if files else "; the shared-memory sample cache size is unknown until the first run preprocesses")
    suggest = f"{max(1, math.ceil((loader_need + (cache_bytes if accel.shm_cache else 0)) * 1.5 / 2**30))}g"
    grow = (f"give it more shared memory: `docker run --shm-size={suggest}` (Kubernetes: an emptyDir with "
            f"medium: Memory at {SHM_PATH}) or `mount -o remount,size={suggest} {SHM_PATH}`")
    if loader_need > free:
        return failed(saw + ": loader workers would die with 'bus error'",
                      f"{grow}; or lower accel.num_workers / accel.prefetch_factor", data)
    if accel.shm_cache and files:
        budget = min(accel.shm_cache_max_gb * 2**30, free - loader_need)
        if cache_bytes > budget:
            return warned(saw + f": more than the cache budget of {gib(budget)}, so the run goes uncached",
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
    Check("memory.shm", shm_space),
    Check("memory.pinned", pinned_memory),
]
