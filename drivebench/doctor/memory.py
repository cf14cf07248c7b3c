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
    Check("memory.shm", shm_space),
    Check("memory.pinned", pinned_memory),
]
