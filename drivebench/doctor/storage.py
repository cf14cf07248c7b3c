"""Family 5: where checkpoints are written and where the dataset is read.

The field report: checkpoint writes to a badly placed network volume blocked training for minutes.
The doctor writes a checkpoint-sized file (3x the model's parameter bytes) with fsync where the run
would, compares with the system temp dir (local disk), reads a sample of the dataset's files with
the page cache dropped for them, and removes everything it wrote.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from drivebench.ckpt.write_probe import WriteStats, write_probe
from drivebench.doctor.context import CkptTarget, DoctorContext
from drivebench.doctor.probe import error_text, gib
from drivebench.doctor.result import Check, CheckResult, failed, informed, passed, warned
from drivebench.errors import ConfigError
from drivebench.perf.machine import filesystem_of, is_network_fs

if TYPE_CHECKING:
    from drivebench.ckpt.store import CheckpointStore

VOLATILE_FS = {"tmpfs", "ramfs", "overlay"}
CHUNK = 8 * 2**20
SLOW_RATIO = 0.5          # a network mount below half the local disk's bandwidth is "much slower"
READ_SAMPLE_FILES = 32
READ_SAMPLE_BYTES = 512 * 2**20
FILES_LISTED = 5000


def _store(location: str | Path, storage_options: dict | None = None) -> CheckpointStore:
    """The run's own view of a location, local or fsspec (imported when used: it needs torch)."""
    from drivebench.ckpt.store import CheckpointStore

    return CheckpointStore(str(location), storage_options)


def local_write(ctx: DoctorContext, nbytes: int) -> WriteStats | None:
    """The same write to the system temp dir (the local-disk reference), measured once."""
    key = ("local_write", nbytes)
    if key not in ctx.memo:
        try:
            ctx.memo[key] = write_probe(_store(tempfile.gettempdir()), nbytes)
        except OSError:
            ctx.memo[key] = None
    return ctx.memo[key]


def _fs_text(fs: dict) -> str:
    return f"{fs['fstype'] or 'unknown fs'} at {fs['mount'] or '?'}, {gib((fs['free_gb'] or 0) * 2**30)} free"


def ckpt_dir_check(ctx: DoctorContext) -> CheckResult:
    """ckpt.dir: can be created and written, its filesystem, and room for the checkpoints the run keeps."""
    target, error = ctx.ckpt_target()
    if error:
        return failed(error, "set ckpt.dir to a writable path or URL, e.g. ckpt.dir=/local/disk/checkpoints")
    if target is None:
        return informed("ckpt=none: this run writes no checkpoints")
    if target.remote:
        return _remote_ckpt_dir(target)
    directory = target.path
    assert directory is not None
    remedy = (f"point ckpt.dir at a writable directory on local disk (e.g. ckpt.dir=$HOME/drivebench-ckpt), or fix "
              f"the permissions of {directory}")
    try:
        ctx.made.make(directory)
        write_probe(_store(directory), 4096)
    except OSError as err:
        return failed(f"ckpt.dir={directory} cannot be created or written: {error_text(err)}", remedy,
                      {"dir": str(directory)})
    fs = filesystem_of(directory)
    size, how = ctx.checkpoint_bytes()
    keep = int(ctx.select("ckpt.keep_last_k", 1) or 0)
    copies = (keep if keep > 0 else 1) + 1  # the kept ones + the one being written (keep_last_k=0: all, at least 2)
    need = size * copies
    stand_in = ""
    if ctx.output_stand_in is not None and ctx.output_stand_in in [directory, *directory.parents]:
        stand_in = " (stand-in for the Hydra run directory, see the note above)"
    saw = (f"ckpt.dir={directory}{stand_in}: writable, {_fs_text(fs)}; a checkpoint is ~{gib(size)} ({how}), "
           f"up to {copies} on disk at once")
    data = {"dir": str(directory), "filesystem": fs, "checkpoint_bytes": size, "estimate": how, "copies": copies,
            "network": is_network_fs(fs["fstype"])}
    if fs["free_gb"] is not None and fs["free_gb"] * 2**30 < need:
        return failed(saw + f": needs {gib(need)}",
                      "free space there, lower ckpt.keep_last_k, or move ckpt.dir to a larger disk", data)
    if fs["fstype"] in VOLATILE_FS:
        return warned(saw + f": {fs['fstype']} is lost when the machine or container goes away",
                      "put ckpt.dir on persistent storage (a mounted volume on local disk)", data)
    if ctx.select("ckpt.name") == "remote":
        return warned(saw + "; ckpt=remote, but ckpt.dir is a local path (set none, the local default was kept)",
                      "set ckpt.dir=<URL>, e.g. ckpt.dir=s3://bucket/drivebench/run1, or use ckpt=local", data)
    if keep == 0:
        return warned(saw + "; ckpt.keep_last_k=0 keeps every checkpoint, so the directory grows all run",
                      "set ckpt.keep_last_k=2 unless every checkpoint is needed", data)
    return passed(saw, data)


def _remote_ckpt_dir(target: CkptTarget) -> CheckResult:
    """A checkpoint URL: the run's own preflight (create, write and delete a probe object)."""
    data = {"dir": target.location, "remote": True}
    try:
        store = _store(target.location, target.storage_options)
        store.prepare()
    except ConfigError as err:
        return failed(str(err), "check the URL, its fsspec backend (s3fs, gcsfs, ...) and ckpt.storage_options", data)
    except Exception as err:
        return failed(f"ckpt.dir={target.location} cannot be written: {error_text(err)}",
                      "check the URL, its fsspec backend (s3fs, gcsfs, ...) and ckpt.storage_options", data)
    return passed(f"ckpt.dir={target.location}: a remote store ({store.protocol}), writable; speed: see "
                  "storage.ckpt_write", data)


def ckpt_write_check(ctx: DoctorContext) -> CheckResult:
    """Write + fsync of one checkpoint-sized file in ckpt.dir: latency and bandwidth, against local disk."""
    target, error = ctx.ckpt_target()
    if error or target is None:
        return informed("no checkpoint directory to measure (see storage.ckpt_dir)")
    size, how = ctx.checkpoint_bytes()
    try:
        if target.remote:
            stats = write_probe(_store(target.location, target.storage_options), size)  # as a run sends one
            fs = {"fstype": "remote", "mount": target.location, "free_gb": None}
        else:
            assert target.path is not None
            ctx.made.make(target.path)
            stats, fs = write_probe(_store(target.path), size), filesystem_of(target.path)
    except Exception as err:  # OSError locally; fsspec backends raise many kinds
        return failed(f"writing {gib(size)} to {target.location} failed: {error_text(err)}",
                      "point ckpt.dir at a writable location with room for the checkpoints", {"dir": target.location})
    local = local_write(ctx, size)
    local_fs = filesystem_of(tempfile.gettempdir())
    same_fs = not target.remote and local_fs["mount"] == fs["mount"]
    data = {"dir": target.location, "filesystem": fs, "write": asdict(stats), "mb_per_s": stats.mb_per_s,
            "local_mb_per_s": local.mb_per_s if local else None, "same_fs_as_tmp": same_fs}
    saw = (f"{gib(size)} written{' with fsync' if not target.remote else ''} in {stats.seconds:.2f} s "
           f"({stats.mb_per_s:.0f} MB/s) on {fs['fstype']}: a synchronous save blocks the step about that long")
    if local is not None:
        saw += (f"; system temp dir {local.mb_per_s:.0f} MB/s" + (" (the same filesystem)" if same_fs else ""))
    network = target.remote or is_network_fs(fs["fstype"])
    if network and local is not None and stats.mb_per_s < SLOW_RATIO * local.mb_per_s:
        return warned(saw + f": the {'remote store' if target.remote else 'network mount (' + fs['fstype'] + ')'} "
                            f"is {local.mb_per_s / stats.mb_per_s:.1f}x slower than local disk",
                      "write checkpoints to local disk (ckpt.dir=/local/path) or use ckpt=async so the write leaves "
                      "the training loop, and copy them to shared storage afterwards; or use storage in the same "
                      "zone as the machine", data)
    return passed(saw, data)


def _list_files(root: Path, limit: int = FILES_LISTED) -> list[Path]:
    files: list[Path] = []
    for dirpath, dirnames, names in os.walk(root):
        dirnames.sort()
        for name in sorted(names):
            files.append(Path(dirpath) / name)
            if len(files) >= limit:
                return files
    return files


def data_root_check(ctx: DoctorContext) -> CheckResult:
    """The dataset root (data.root, or the embedded set under paths.cache) and the preprocessing cache dir."""
    location = ctx.data_location()
    if location.error:
        return failed(location.error, "point data.root at the dataset (see docs), or leave it unset to use the "
                                      "embedded synthetic set", {"root": str(location.root)})
    data: dict = {"root": str(location.root), "embedded": location.embedded,
                  "cache_dir": str(location.cache_dir) if location.cache_dir else None}
    embedded_parent = location.root.parent if location.embedded and location.root else None
    for label, directory in (("preprocessing cache", location.cache_dir), ("embedded dataset", embedded_parent)):
        if directory is None:
            continue
        try:
            ctx.made.make(directory)
            write_probe(_store(directory), 4096)
        except OSError as err:
            return failed(f"the {label} directory {directory} cannot be created or written: {error_text(err)}",
                          "set paths.cache=/writable/dir (or DRIVEBENCH_CACHE) to a writable local directory", data)
    root = location.root
    if root is None:
        return informed("the data source names no root directory", "", data)
    probe_dir = root if root.exists() else root.parent
    fs = filesystem_of(probe_dir)
    data["filesystem"] = fs
    if not root.exists():
        return passed(f"embedded set not generated yet: the first run writes it to {root} ({_fs_text(fs)})", data)
    files = _list_files(root)
    data["files_listed"] = len(files)
    kind = "embedded set" if location.embedded else "data.root"
    more = "+" if len(files) >= FILES_LISTED else ""
    saw = f"{kind} {root}: {len(files)}{more} files, {_fs_text(fs)}"
    if not files:
        return failed(saw + ": the directory is empty",
                      "point data.root at the dataset, or delete the empty folder so the embedded set is regenerated",
                      data)
    if is_network_fs(fs["fstype"]):
        saw += " (a network mount: see storage.data_read for its speed)"
    return passed(saw, data)


def _read_files(files: list[Path]) -> tuple[int, float]:
    """Read ``files`` whole after asking the kernel to drop them from the page cache; (bytes, seconds)."""
    total, started = 0, time.perf_counter()
    for path in files:
        with open(path, "rb", buffering=0) as handle:
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
            while block := handle.read(CHUNK):
                total += len(block)
    return total, time.perf_counter() - started


def data_read_check(ctx: DoctorContext) -> CheckResult:
    """Read bandwidth of a sample of the dataset's files (page cache dropped for them first)."""
    location = ctx.data_location()
    root = location.root
    if location.error or root is None or not root.is_dir():
        return informed("no dataset files to read yet (see storage.data_root)")
    files = [f for f in _list_files(root) if f.is_file()]
    if not files:
        return informed(f"no files under {root}")
    step = max(len(files) // READ_SAMPLE_FILES, 1)
    sample, budget = [], READ_SAMPLE_BYTES
    for path in files[::step][:READ_SAMPLE_FILES]:
        size = path.stat().st_size
        if size <= budget:
            sample.append(path)
            budget -= size
    try:
        nbytes, seconds = _read_files(sample)
    except OSError as err:
        return failed(f"reading the dataset under {root} failed: {error_text(err)}",
                      "check the permissions and the mount of data.root", {"root": str(root)})
    fs = filesystem_of(root)
    mb_s = nbytes / seconds / 1e6 if seconds > 0 else float("inf")
    data = {"root": str(root), "files": len(sample), "bytes": nbytes, "seconds": seconds, "mb_per_s": mb_s,
            "files_per_s": len(sample) / seconds if seconds > 0 else None, "filesystem": fs}
    saw = (f"read {len(sample)} files ({gib(nbytes)}) in {seconds:.2f} s: {mb_s:.0f} MB/s, "
           f"{data['files_per_s'] or 0:.0f} files/s on {fs['fstype']}")
    local = local_write(ctx, 64 * 2**20)
    if is_network_fs(fs["fstype"]) and local is not None and mb_s < SLOW_RATIO * local.mb_per_s:
        return warned(saw + f": slower than the local disk's {local.mb_per_s:.0f} MB/s writes",
                      "copy the dataset to local disk (or keep paths.cache on local disk so preprocessed samples are "
                      "read from there), and use loader workers (accel.num_workers) to overlap reads", data)
    return passed(saw, data)


CHECKS = [
    Check("storage.ckpt_dir", ckpt_dir_check),
    Check("storage.ckpt_write", ckpt_write_check, slow=True),
    Check("storage.data_root", data_root_check),
    Check("storage.data_read", data_read_check, slow=True),
]
