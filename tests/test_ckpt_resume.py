"""Crash safety and exact resume, end to end through ``python -m drivebench``.

An uninterrupted 16-step run (no checkpoints at all) is the reference. Interrupted runs are killed
with SIGKILL (mid-run, and half-way through writing a checkpoint); the directory must then hold
only complete checkpoints under final names, and ``resume=auto`` must continue so that every later
step's loss equals the reference's (same global steps; QCNet test has dropout, so this needs the RNG
states and the data position restored, not just the weights).
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import torch

from drivebench.ckpt.checkpoint_io import FAULT_ENV
from drivebench.ckpt.store import CheckpointStore, step_of
from test_ckpt_cli_helpers import (assert_same_losses, checkpoint_files, loader_position, losses, scalars, shared_cache,
                                   start_training, step_file, summary, train, wait_for_step)

STEPS = 12  # the mini set has 8 training batches per epoch: resumes land mid-epoch and on an epoch's end
EVERY = 4


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return shared_cache(tmp_path_factory)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("ckpt-resume")


@pytest.fixture(scope="module")
def reference(root, cache):
    """The uninterrupted run, checkpointing every 2 steps to a file:// URL (ckpt=remote): its losses
    are what every resumed run must reproduce, its checkpoints are resumed from by URL below."""
    run_dir = root / "reference"
    train(run_dir, cache, "ckpt=remote", f"ckpt.dir=file://{root / 'reference-store'}", "ckpt.every_n_steps=2",
          "ckpt.keep_last_k=0", steps=STEPS)
    found = losses(run_dir)
    assert sorted(found) == list(range(STEPS))
    return found


def assert_only_complete_checkpoints(directory: Path) -> CheckpointStore:
    """Every file under a final name loads; anything else is a dot-file ``.step-*.ckpt.<pid>.partial`` (or the
    directory's lock)."""
    store = CheckpointStore(str(directory))
    for path in directory.iterdir():
        if step_of(path.name) is not None:
            assert store.loadable(str(path)), f"{path} is under a final name but does not load"
        elif path.name != ".drivebench.lock":
            assert path.name.startswith(".step-") and path.name.endswith(".partial"), f"unexpected {path}"
    return store


def test_sigkill_mid_run_then_resume_auto_matches_uninterrupted_run(root, cache, reference):
    """Killed once step 8 (the end of the first epoch) is saved; continued in the same ckpt.dir."""
    ckpt_dir = root / "killed-ckpt"
    proc = start_training(root / "killed", cache, f"ckpt.dir={ckpt_dir}", f"ckpt.every_n_steps={EVERY}",
                          steps=100)  # would run far past the reference: it is killed
    eighth = wait_for_step(ckpt_dir, 8, proc)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL

    store = assert_only_complete_checkpoints(ckpt_dir)
    latest = store.latest_complete()
    assert latest == str(eighth), "the kill came later than four steps after the save?"
    state = store.load(latest)
    assert state["global_step"] == 8 and "rng" in state["callbacks"]["RngState"]
    assert loader_position(state) == (1, 0)  # the next batch is the second epoch's first

    run_dir = root / "killed-resumed"  # asynchronous writes this time
    train(run_dir, cache, f"ckpt.dir={ckpt_dir}", f"ckpt.every_n_steps={EVERY}", "ckpt=async", "resume=auto",
          steps=STEPS)
    result = summary(run_dir)
    assert result["run"]["resumed_from"] == latest
    assert_same_losses(losses(run_dir), reference, 8, STEPS)
    ckpts = result["checkpoints"]
    assert ckpts["async"] is True and [s["step"] for s in ckpts["each"]] == [12]
    assert ckpts["each"][0]["blocking_s"] > 0 and ckpts["each"][0]["write_s"] > 0
    assert_only_complete_checkpoints(ckpt_dir)
    assert [step for step, _ in store.list_steps()] == [8, 12]  # keep_last_k=2 (the default) across both runs


def test_kill_during_checkpoint_write_then_resume_from_another_run_dir(root, cache, reference):
    """The fault hook SIGKILLs the process half-way through writing step 8; the next run lives in
    a new run directory with its own (empty) default ckpt.dir and finds the checkpoint through
    paths.outputs_root. It resumes mid-epoch (step 4) and crosses the epoch boundary."""
    outputs = root / "outputs"
    crashed = outputs / "crashed"
    proc = start_training(crashed, cache, f"ckpt.every_n_steps={EVERY}", f"paths.outputs_root={outputs}",
                          steps=STEPS, env={FAULT_ENV: "8"})
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == -signal.SIGKILL, f"expected the fault hook to SIGKILL the run:\n{err[-3000:]}"

    ckpt_dir = crashed / "checkpoints"  # the default ckpt.dir: ${paths.output_dir}/checkpoints
    fourth = step_file(ckpt_dir, 4)
    assert fourth is not None
    (partial,) = [name for name in checkpoint_files(ckpt_dir) if name.startswith(".")]
    assert partial.startswith(f".{fourth.name.replace('00000004', '00000008')}.") and partial.endswith(".partial")
    assert checkpoint_files(ckpt_dir) == [partial, fourth.name]
    with pytest.raises(Exception):  # really half a checkpoint
        torch.load(ckpt_dir / partial, weights_only=True)
    store = assert_only_complete_checkpoints(ckpt_dir)
    assert store.latest_complete() == str(fourth)

    run_dir = outputs / "run2"
    train(run_dir, cache, f"ckpt.every_n_steps={EVERY}", f"paths.outputs_root={outputs}", "resume=auto",
          steps=STEPS)
    result = summary(run_dir)
    assert result["run"]["resumed_from"] == str(fourth)
    assert_same_losses(losses(run_dir), reference, 4, STEPS)
    # the same training, continued: its run id and fingerprint name the new files too
    assert checkpoint_files(run_dir / "checkpoints") == [fourth.name.replace("00000004", f"{s:08d}") for s in (8, 12)]

    # what every save cost, in the summary and in TensorBoard (synchronous writes here)
    ckpts = result["checkpoints"]
    assert ckpts["saves"] == 2 and ckpts["async"] is False
    assert ckpts["filesystem"]["kind"] in ("local disk", "tmpfs (memory)", "network or FUSE mount", "unknown")
    assert ckpts["filesystem"]["path"] == str(run_dir / "checkpoints")
    for save in ckpts["each"]:
        assert save["bytes"] > 100_000 and save["write_s"] > 0 and save["blocking_s"] >= save["write_s"]
        assert save["mb_per_s"] == pytest.approx(save["bytes"] / 2**20 / save["write_s"])
    for tag in ("fit/perf/ckpt_blocking_s", "fit/perf/ckpt_write_s", "fit/perf/ckpt_mb_per_s", "fit/perf/ckpt_mb"):
        assert sorted(scalars(run_dir, tag)) == [8, 12], tag
    # the step timer books the save after step 8 as checkpoint time of the next step, not as data wait
    train_phase = result["train"]
    assert train_phase["ckpt_blocking_s"]["n"] == STEPS - 4
    assert train_phase["ckpt_blocking_s"]["max"] == pytest.approx(ckpts["each"][0]["blocking_s"], rel=0.2, abs=0.02)
    assert train_phase["ckpt_blocking_s"]["median"] == 0.0  # only one measured step contains a save


def test_resume_from_a_file_url_mid_epoch_through_the_epoch_stream(root, cache, reference):
    """resume=file://... (the reference's checkpoint at step 6, written by ckpt=remote), with loader workers
    streaming across epochs (accel.prefetch_across_epochs): from step 6 (mid-epoch) over the epoch boundary
    at step 8, losses equal the reference's. (One run for both: a mid-epoch resume with the default loader
    is the kill-during-write test's, from step 4.)"""
    store_dir = root / "reference-store"
    assert [step for step, _ in CheckpointStore(f"file://{store_dir}").list_steps()] == [2, 4, 6, 8, 10, 12]
    run_dir = root / "from-url-stream"
    sixth = step_file(store_dir, 6)
    train(run_dir, cache, "ckpt=none", f"resume=file://{sixth}", "accel.num_workers=1",
          "accel.persistent_workers=true", "accel.prefetch_across_epochs=true", steps=STEPS)
    result = summary(run_dir)
    assert result["run"]["resumed_from"] == str(sixth)
    assert result["data"]["epoch_stream"] == {"iterator_starts": 1, "next_batch": [1, STEPS - 8]}
    assert_same_losses(losses(run_dir), reference, 6, STEPS)
