"""Corrupt and unusual input (issue 21, 5): data errors name the file and exit 2 in one line, wherever they are
raised; ``data.on_corrupt=skip`` counts what it skips during training; a read-only populated cache is used as
it is; the disk-space preflight sizes checkpoints from what they hold.

Before: a truncated map-expansion JSON or an invalid ``sample.json`` gave ``JSONDecodeError ... column 583902``
without the file; missing or corrupt files exited 1 with a traceback; a JPEG that broke after the index was
cached crashed the shared-memory image cache or was skipped uncounted (``skipped_at_index {}``); a read-only
cache failed creating its lock file; the preflight estimated a checkpoint at 3x the parameter bytes.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import stat
import subprocess
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import lightning.pytorch as pl
import pytest
import torch

from drivebench.ckpt.callback import estimate_checkpoint_bytes
from drivebench.ckpt.store import CheckpointWriteError
from drivebench.errors import DataError, data_error_in_worker, load_json
from test_ckpt_callback import Toy, ToyData, checkpointing, trainer_for
from test_ckpt_cli_helpers import TRAIN, cli_env, command, shared_cache

pytestmark = pytest.mark.usefixtures("one_torch_thread")

MAPTR = ["model=maptr", "model.size=test", "data.size=mini", "accel=none", "bench.ceiling=false",
         "bench.val_batches=0", "bench.warmup_steps=0", "bench.steps=2", "ckpt=none"]
QCNET = [*TRAIN, "bench.steps=1", "ckpt=none"]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return shared_cache(tmp_path_factory)


@pytest.fixture(scope="module")
def datasets(tmp_path_factory) -> dict[str, Path]:
    """The embedded mini sets, generated once, to be copied and damaged (read as real data: data.root)."""
    from drivebench.data.argoverse2.generate import ensure_generated as av2
    from drivebench.data.nuscenes.generate import ensure_generated as nuscenes

    root = tmp_path_factory.mktemp("pristine")
    return {"nuscenes": nuscenes(root / "nuscenes", "mini", progress=False),
            "argoverse2": av2(root / "argoverse2", "mini", progress=False)}


def copy_of(datasets: dict[str, Path], name: str, where: Path) -> Path:
    return Path(shutil.copytree(datasets[name], where / name))


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def config(cache: Path, out: Path, *overrides: str) -> Any:
    """The run's composed config, as the drivebench command composes it (in this process)."""
    from drivebench.compose import compose

    return compose([*overrides, f"paths.cache={cache}", f"paths.output_dir={out}"])


def read_training_data(cache: Path, out: Path, *overrides: str) -> Any:
    """What a run does with its data before the first step, in this process: the run is built (build_run),
    the data source prepares (devkit tables, sample index, preprocessing) and the datasets are set up
    (MapTR's map targets); then one training sample is read. Returns the run."""
    from drivebench.app import build_run

    run = build_run(config(cache, out, *overrides), out, progress=False)
    run.datamodule.prepare_data()
    run.datamodule.setup("fit")
    run.datamodule.train_set[0]
    return run


def run_side_by_side(jobs: dict[str, list[str]], cache: Path, cwd: Path) -> dict[str, subprocess.CompletedProcess]:
    """``python -m drivebench`` for each job, two at a time (the machine has two cores; each run uses one)."""
    done: dict[str, subprocess.CompletedProcess] = {}
    names = list(jobs)
    for pair in (names[i:i + 2] for i in range(0, len(names), 2)):
        procs = {n: subprocess.Popen(command(jobs[n]), cwd=cwd, env=cli_env(cache), stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True) for n in pair}
        for n, proc in procs.items():
            out, err = proc.communicate(timeout=300)
            done[n] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    return done


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("drivebench: error:")]
    assert len(lines) == 1, proc.stderr[-3000:]
    return lines[0]


def one_error_line_in_process(stderr: str) -> str:
    """The same contract for ``drivebench.app.main`` run in this process (it exited with code 2)."""
    lines = [line for line in stderr.splitlines() if line.startswith("drivebench: error:")]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr[-3000:]
    return lines[0]


# ---- files that are not what their format says: named ---------------------------------------------------------
def test_broken_dataset_files_are_named_in_one_line(tmp_path, cache, datasets):
    """In this process, through the real readers (the nuScenes devkit, NuScenesMap, pyarrow, the AV2 map
    JSON): each damaged file is named in a one-line DataError (what the drivebench command prints, exit 2:
    test_data_errors_reach_the_command_line_as_one_line_with_exit_2)."""
    table_root = copy_of(datasets, "nuscenes", tmp_path / "table")
    truncate(table_root / "v1.0-mini" / "sample.json")
    map_root = copy_of(datasets, "nuscenes", tmp_path / "map")
    expansion = sorted((map_root / "maps" / "expansion").glob("*.json"))[0]
    truncate(expansion)
    parquet_root = copy_of(datasets, "argoverse2", tmp_path / "parquet")
    scenario = sorted((parquet_root / "train").iterdir())[0]
    parquet = next(scenario.glob("scenario_*.parquet"))
    truncate(parquet)
    no_map_root = copy_of(datasets, "argoverse2", tmp_path / "nomap")
    no_map = next(sorted((no_map_root / "train").iterdir())[0].glob("log_map_archive_*.json"))
    no_map.unlink()
    cases = {
        "table": ([*MAPTR, f"data.root={table_root}"], [str(table_root / "v1.0-mini" / "sample.json"),
                                                        "not valid JSON", "line "]),
        "map": ([*MAPTR, f"data.root={map_root}"], [str(expansion), "map expansion"]),
        "parquet": ([*QCNET, f"data.root={parquet_root}"], [str(parquet), "parquet"]),
        "no_map": ([*QCNET, f"data.root={no_map_root}"], [str(no_map)]),
    }
    for name, (overrides, named) in cases.items():
        with pytest.raises(DataError) as err:
            read_training_data(cache, tmp_path / f"r-{name}", *overrides)
        message = str(err.value)
        assert "\n" not in message and all(part in message for part in named), (name, message)


@pytest.fixture(scope="module")
def broken_jpegs(tmp_path_factory, cache, datasets) -> tuple[Path, list[Path]]:
    """A nuScenes copy whose sample index was cached while every file was good; then three front-camera
    JPEGs broke (SOI and EOI markers, nothing decodable between): what the index cannot see."""
    where = tmp_path_factory.mktemp("broken-jpegs")
    root = copy_of(datasets, "nuscenes", where)
    run = read_training_data(cache, where / "index", *MAPTR, f"data.root={root}")
    assert run.datamodule.source.describe()["skipped_at_index"] == {}
    broken = sorted((root / "samples" / "CAM_FRONT").glob("*.jpg"))[:3]
    for jpeg in broken:
        jpeg.write_bytes(b"\xff\xd8\xff" + bytes(2000) + b"\xff\xd9")
    return root, broken


def test_data_errors_reach_the_command_line_as_one_line_with_exit_2(tmp_path, cache, datasets, broken_jpegs):
    """End to end, side by side: a table the devkit cannot parse (raised while preparing the data) and a JPEG
    that a loader worker cannot decode (raised in the worker, re-raised by torch as text): exit 2, one line
    naming the file, no traceback."""
    root, broken = broken_jpegs
    table_root = copy_of(datasets, "nuscenes", tmp_path / "table")
    truncate(table_root / "v1.0-mini" / "sample.json")
    jobs = {
        "table": [*MAPTR, f"data.root={table_root}", f"hydra.run.dir={tmp_path / 'table-run'}"],
        "worker": [*MAPTR, f"data.root={root}", "accel.num_workers=1", "bench.steps=12",
                   f"hydra.run.dir={tmp_path / 'worker-run'}"],
    }
    done = run_side_by_side(jobs, cache, tmp_path)
    line = one_error_line(done["table"])
    assert str(table_root / "v1.0-mini" / "sample.json") in line and "not valid JSON" in line
    line = one_error_line(done["worker"])
    assert any(str(b) in line for b in broken) and "does not decode" in line and "data.on_corrupt=skip" in line
    assert not list(tmp_path.rglob("summary.json"))


def test_load_json_names_the_file(tmp_path):
    bad = tmp_path / "map.json"
    bad.write_text('{"lane_segments": {"1": [1, 2')
    with pytest.raises(DataError, match=rf"{bad} is not valid JSON \(.* at line 1 column \d+\)"):
        load_json(bad)
    with pytest.raises(FileNotFoundError, match="does not exist"):  # a MissingDataError is both
        load_json(tmp_path / "absent.json")


def test_a_data_error_from_a_loader_worker_is_recognised():
    """torch re-raises a worker's DataFileError as a RuntimeError holding the worker's traceback as text."""
    from torch.utils.data import DataLoader, Dataset

    from drivebench.data.nuscenes.errors import CorruptFileError

    class Broken(Dataset):
        def __len__(self) -> int:
            return 2

        def __getitem__(self, index: int) -> Any:
            raise CorruptFileError("/data/cam.jpg", "tok", "image does not decode as JPEG")

    with pytest.raises(Exception) as err:
        next(iter(DataLoader(Broken(), num_workers=1)))
    assert data_error_in_worker(err.value) == ("image does not decode as JPEG: /data/cam.jpg (sample tok); "
                                               "re-download or regenerate the file, or set data.on_corrupt=skip "
                                               "to drop the sample")
    assert data_error_in_worker(RuntimeError("Caught ValueError in DataLoader worker process 0.\nValueError: x")) \
        is None


# ---- on_corrupt=skip after the index was cached --------------------------------------------------------------
@pytest.mark.parametrize("shm_cache", [False, True], ids=["loader", "shm-cache"])
def test_images_that_break_after_indexing_are_skipped_and_counted(shm_cache, tmp_path, cache, broken_jpegs,
                                                                  caplog):
    """A whole run (drivebench.app.main, in this process) with data.on_corrupt=skip: the broken images are
    skipped, each named in the log, and counted in the summary. The shared-memory image cache decodes every
    image up front: it leaves the broken ones out, and the loader, reading them itself, skips them."""
    from drivebench.app import main

    root, broken = broken_jpegs
    out = tmp_path / "run"
    cfg = config(cache, out, *MAPTR, f"data.root={root}", "data.on_corrupt=skip", "bench.steps=6",
                 f"accel.shm_cache={str(shm_cache).lower()}")
    with caplog.at_level("WARNING", logger="drivebench.data.transforms.dataset"):
        summary = main(cfg)
    assert json.loads((out / "summary.json").read_text())["data"] == summary["data"]
    data = summary["data"]
    assert data["skipped_at_index"] == {}  # the index, cached before, saw nothing wrong
    skipped = data["skipped_in_training"]
    assert skipped["corrupt"] >= 1 and skipped["missing"] == 0, skipped
    if shm_cache:
        assert data["shm_cache"]["enabled"] is True, data["shm_cache"]
    named = [r.getMessage() for r in caplog.records if "skipped a sample" in r.getMessage()]
    assert len(named) == sum(skipped.values()) and all(any(str(b) in m for b in broken) for m in named)


# ---- a read-only cache that holds everything -------------------------------------------------------------------
_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH = 1, 2  # linux/capability.h


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


@contextmanager
def file_modes_apply_to_root() -> Iterator[bool]:
    """Root ignores file modes (CAP_DAC_OVERRIDE): for root, drop that capability from this thread's effective
    set (kept in the permitted set, restored after), so a chmod-read-only directory is read-only to it, as it
    is to every other user. Yields False where that is not possible (no capget/capset)."""
    if os.geteuid() != 0:
        yield True
        return
    libc = ctypes.CDLL(None, use_errno=True)
    header, data = _CapHeader(0x20080522, 0), (_CapData * 2)()  # _LINUX_CAPABILITY_VERSION_3, this thread
    if not hasattr(libc, "capget") or libc.capget(ctypes.byref(header), data) != 0:
        yield False
        return
    saved = data[0].effective
    data[0].effective &= ~((1 << _CAP_DAC_OVERRIDE) | (1 << _CAP_DAC_READ_SEARCH))
    if libc.capset(ctypes.byref(header), data) != 0:
        yield False
        return
    try:
        yield True
    finally:
        data[0].effective = saved
        assert libc.capset(ctypes.byref(header), data) == 0


def set_writable(root: Path, writable: bool) -> None:
    for path in [root, *root.rglob("*")]:
        if path.is_symlink():
            continue
        mode = path.stat().st_mode
        path.chmod(mode | stat.S_IWUSR if writable else mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


def test_a_read_only_populated_cache_is_used_without_writing(tmp_path):
    """What a user meets on a shared cache that someone else populated: every file and folder without write
    permission (chmod; for root, with the capability that overrides modes dropped). A whole run in this
    process first populates the cache, a second runs on it read-only."""
    from drivebench.app import main

    cache = tmp_path / "cache"
    main(config(cache, tmp_path / "populate", *QCNET))
    assert any(cache.rglob("*.parquet")) and (cache / "preprocessed").is_dir()
    set_writable(cache, False)
    try:
        with file_modes_apply_to_root() as applies:
            probe = cache / "preprocessed" / "probe"
            try:
                probe.touch()
                writes = True
            except PermissionError:
                writes = False
            if not applies or writes:
                pytest.skip("file modes do not stop this process from writing (root without capset)")
            summary = main(config(cache, tmp_path / "read-only", *QCNET))
        assert summary["run"]["status"] == "completed" and summary["train"]["samples"] > 0
        assert json.loads((tmp_path / "read-only" / "summary.json").read_text())["run"]["status"] == "completed"
    finally:
        set_writable(cache, True)


# ---- the checkpoint size the preflight and the first save check -------------------------------------------------
def test_the_estimate_covers_what_a_checkpoint_holds(tmp_path):
    """Before the first step Adam has no state: two moments per trainable parameter are counted; after a
    step the state is measured. Either way the estimate covers the file actually written."""
    ckpt = checkpointing(str(tmp_path / "ckpt"), every_n_steps=1)
    pl.seed_everything(7, verbose=False)
    module = Toy()
    trainer = trainer_for(tmp_path, ckpt, max_steps=1)
    trainer.fit(module, datamodule=ToyData())
    written = ckpt.io.saves[0]["bytes"]
    estimate = ckpt.estimated_bytes
    params = sum(p.numel() * p.element_size() for p in module.parameters())
    assert estimate >= written and estimate - written <= 2**20  # the allowance for loops, RNG, config
    assert estimate_checkpoint_bytes(module, trainer.optimizers) >= 3 * params  # weights + measured moments


class BigCallbackState(pl.Callback):
    """State outside the module and the optimizers (as an EMA callback keeps), which no estimate sees."""

    def state_dict(self) -> dict[str, Any]:
        return {"ema": torch.zeros(1_000_000)}  # 4 MB


def small_tmpfs(tmp_path: Path, size: str, why_skip: str) -> Path:
    """A tmpfs of ``size`` under ``tmp_path`` (free-space checks need a small filesystem); skips where
    mounting is refused. The caller unmounts it."""
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)],
                      capture_output=True).returncode != 0:
        pytest.skip(why_skip)
    return mount


def test_the_first_save_measures_and_stops_a_run_that_cannot_fit(tmp_path):
    mount = small_tmpfs(tmp_path, "10m", "cannot mount a tmpfs here")
    try:
        ckpt = checkpointing(str(mount / "ckpt"), every_n_steps=1, keep_last_k=2)
        pl.seed_everything(7, verbose=False)
        trainer = trainer_for(tmp_path, ckpt, callbacks=[BigCallbackState()], max_steps=10)
        with pytest.raises(CheckpointWriteError) as err:
            trainer.fit(Toy(), datamodule=ToyData())
        message = str(err.value)
        assert "measured at its first save" in message and "2 more will be on disk" in message
        assert f"resume={ckpt.io.saves[0]['path']}" in message  # and how to continue from it
        assert [s["step"] for s in ckpt.io.saves] == [1] and ckpt.estimated_bytes < ckpt.io.saves[0]["bytes"]
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def test_the_preflight_refuses_a_directory_the_checkpoints_would_not_fit(tmp_path, cache, capsys):
    """QCNet test: 6.8 MB checkpoints, 1.95 MB of parameters. 3 x the parameter bytes x (keep_last_k + 1) =
    17.6 MB fitted a 19 MiB tmpfs, where the third checkpoint then failed; the estimate from the state dict
    (3 x 6.9 MB) does not, and the run (drivebench.app.main, in this process) stops before its first step
    with one line and exit 2. Free space is what is checked: this needs a filesystem that small (a mount)."""
    from drivebench.app import main

    mount = small_tmpfs(tmp_path, "19m", "cannot mount a tmpfs here (the preflight reads the free space of a "
                        "small filesystem)")
    try:
        cfg = config(cache, tmp_path / "run", *TRAIN, "bench.steps=6", "ckpt.every_n_steps=2",
                     f"ckpt.dir={mount / 'ckpt'}")
        with pytest.raises(SystemExit) as exited:
            main(cfg)
        assert exited.value.code == 2
        line = one_error_line_in_process(capsys.readouterr().err)
        assert line.startswith(f"drivebench: error: ckpt.dir={mount / 'ckpt'} has 19 MiB free but the checkpoints "
                               "of this run need about 20 MiB")
        assert not list((mount / "ckpt").glob("step-*"))
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)
