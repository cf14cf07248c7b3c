"""Corrupt and unusual input (issue 21, 5): data errors name the file and exit 2 in one line, wherever they are
raised; ``data.on_corrupt=skip`` counts what it skips during training; a read-only populated cache is used as
it is; the disk-space preflight sizes checkpoints from what they hold.

Before: a truncated map-expansion JSON or an invalid ``sample.json`` gave ``JSONDecodeError ... column 583902``
without the file; missing or corrupt files exited 1 with a traceback; a JPEG that broke after the index was
cached crashed the shared-memory image cache or was skipped uncounted (``skipped_at_index {}``); a read-only
cache failed creating its lock file; the preflight estimated a checkpoint at 3x the parameter bytes.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch

from drivebench.ckpt.callback import estimate_checkpoint_bytes
from drivebench.ckpt.store import CheckpointWriteError
from drivebench.errors import DataError, data_error_in_worker, load_json
from test_ckpt_callback import Toy, ToyData, checkpointing, trainer_for
from test_ckpt_cli_helpers import TRAIN, cli_env, command, shared_cache

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


# ---- files that are not what their format says: named, exit 2 ------------------------------------------------
def test_broken_dataset_files_are_named_in_one_line_with_exit_2(tmp_path, cache, datasets):
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
    jobs = {
        "table": [*MAPTR, f"data.root={table_root}", f"hydra.run.dir={tmp_path / 'r-table'}"],
        "map": [*MAPTR, f"data.root={map_root}", f"hydra.run.dir={tmp_path / 'r-map'}"],
        "parquet": [*QCNET, f"data.root={parquet_root}", f"hydra.run.dir={tmp_path / 'r-parquet'}"],
        "no_map": [*QCNET, f"data.root={no_map_root}", f"hydra.run.dir={tmp_path / 'r-nomap'}"],
    }
    done = run_side_by_side(jobs, cache, tmp_path)
    line = one_error_line(done["table"])
    assert str(table_root / "v1.0-mini" / "sample.json") in line and "not valid JSON" in line and "line " in line
    line = one_error_line(done["map"])
    assert str(expansion) in line and "map expansion" in line
    line = one_error_line(done["parquet"])
    assert str(parquet) in line and "parquet" in line
    line = one_error_line(done["no_map"])
    assert str(no_map) in line


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
def test_images_that_break_after_indexing_are_skipped_and_counted_or_named(tmp_path, cache, datasets):
    root = copy_of(datasets, "nuscenes", tmp_path / "data")
    warm = run_side_by_side({"index": [*MAPTR, f"data.root={root}", f"hydra.run.dir={tmp_path / 'index'}"]},
                            cache, tmp_path)["index"]
    assert warm.returncode == 0, warm.stderr[-3000:]  # the sample index is cached, every file good
    broken = sorted((root / "samples" / "CAM_FRONT").glob("*.jpg"))[:3]
    for jpeg in broken:
        jpeg.write_bytes(b"\xff\xd8\xff" + bytes(2000) + b"\xff\xd9")  # SOI and EOI, nothing decodable between
    skip = [*MAPTR, f"data.root={root}", "data.on_corrupt=skip", "bench.steps=6"]
    jobs = {
        "skip": [*skip, f"hydra.run.dir={tmp_path / 'skip'}"],
        # the shared-memory image cache decodes every image up front: it leaves the broken ones out
        "skip_shm": [*skip, "accel.shm_cache=true", f"hydra.run.dir={tmp_path / 'skip-shm'}"],
        # a loader worker meets the broken file: named in one line all the same
        "fail": [*MAPTR, f"data.root={root}", "accel.num_workers=1", "bench.steps=12",
                 f"hydra.run.dir={tmp_path / 'fail'}"],
    }
    done = run_side_by_side(jobs, cache, tmp_path)
    for name in ("skip", "skip_shm"):
        assert done[name].returncode == 0, done[name].stderr[-3000:]
        data = json.loads((tmp_path / name.replace("_", "-") / "summary.json").read_text())["data"]
        assert data["skipped_at_index"] == {}  # the index, cached before, saw nothing wrong
        skipped = data["skipped_in_training"]
        assert skipped["corrupt"] >= 1 and skipped["missing"] == 0, skipped
        named = [line for line in done[name].stdout.splitlines() + done[name].stderr.splitlines()
                 if "skipped a sample" in line]
        assert named and any(str(b) in line for b in broken for line in named)
    line = one_error_line(done["fail"])
    assert any(str(b) in line for b in broken) and "does not decode" in line and "data.on_corrupt=skip" in line


# ---- a read-only cache that holds everything -------------------------------------------------------------------
def test_a_read_only_populated_cache_is_used_without_writing(tmp_path, datasets):
    backing, cache = tmp_path / "backing", tmp_path / "cache"
    backing.mkdir()
    cache.mkdir()
    if subprocess.run(["mount", "--bind", str(backing), str(cache)], capture_output=True).returncode != 0:
        pytest.skip("cannot bind-mount here (the read-only case needs a read-only filesystem: root ignores modes)")
    try:
        args = [*QCNET, f"hydra.run.dir={tmp_path / 'populate'}"]
        first = subprocess.run(command(args), cwd=tmp_path, env=cli_env(cache), capture_output=True, text=True,
                               timeout=300)
        assert first.returncode == 0, first.stderr[-3000:]
        assert subprocess.run(["mount", "-o", "remount,ro,bind", str(cache)], capture_output=True).returncode == 0
        assert subprocess.run(["touch", str(cache / "probe")], capture_output=True).returncode != 0  # really ro
        args = [*QCNET, f"hydra.run.dir={tmp_path / 'read-only'}"]
        again = subprocess.run(command(args), cwd=tmp_path, env=cli_env(cache), capture_output=True, text=True,
                               timeout=300)
        assert again.returncode == 0, again.stderr[-3000:]
        assert json.loads((tmp_path / "read-only" / "summary.json").read_text())["run"]["status"] == "completed"
    finally:
        subprocess.run(["umount", "-l", str(cache)], capture_output=True)


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


def test_the_first_save_measures_and_stops_a_run_that_cannot_fit(tmp_path):
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=10m", "tmpfs", str(mount)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
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


def test_the_preflight_refuses_a_directory_the_checkpoints_would_not_fit(tmp_path, cache):
    """QCNet test: 6.8 MB checkpoints, 1.95 MB of parameters. 3 x the parameter bytes x (keep_last_k + 1) =
    17.6 MB fitted a 19 MiB tmpfs, where the third checkpoint then failed; the estimate from the state dict
    (3 x 6.9 MB) does not, and the run stops before its first step."""
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=19m", "tmpfs", str(mount)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        args = [*TRAIN, "bench.steps=6", "ckpt.every_n_steps=2", f"ckpt.dir={mount / 'ckpt'}",
                f"hydra.run.dir={tmp_path / 'run'}"]
        done = subprocess.run(command(args), cwd=tmp_path, env=cli_env(cache), capture_output=True, text=True,
                              timeout=300)
        line = one_error_line(done)
        assert line.startswith(f"drivebench: error: ckpt.dir={mount / 'ckpt'} has 19 MiB free but the checkpoints "
                               "of this run need about 20 MiB")
        assert not list((mount / "ckpt").glob("step-*"))
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)
