"""Storage that cannot take a checkpoint: refused before training, or failing mid-run with the
previous checkpoint intact, through ``python -m drivebench``."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import time
from pathlib import Path

import pytest

from drivebench.ckpt.store import CheckpointStore, step_of
from test_ckpt_cli_helpers import checkpoint_files, losses, shared_cache, start_training, train, wait_for_step


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return shared_cache(tmp_path_factory)


def test_unwritable_ckpt_dir_is_refused_before_training(tmp_path, cache):
    blocker = tmp_path / "a-regular-file"
    blocker.write_text("not a directory")  # a path under a file is unwritable even for root
    run_dir = tmp_path / "run"
    proc = train(run_dir, cache, f"ckpt.dir={blocker}/ckpt", "ckpt.every_n_steps=2", steps=4, expect_ok=False)
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in (proc.stdout + proc.stderr).splitlines() if "error" in line.lower()]
    assert len(errors) == 1, errors
    assert errors[0].startswith("drivebench: error: ckpt.dir=") and f"{blocker}/ckpt" in errors[0]
    # named before any work by the directory check (a path under a regular file can never be created)
    assert f"inside {blocker}, a file; it must be a directory" in errors[0]
    assert "Traceback" not in proc.stderr
    assert not (run_dir / "tb").exists() or not losses(run_dir)  # no training step was taken


def _children_ignore_sigxfsz() -> None:
    # with SIGXFSZ ignored, a write past RLIMIT_FSIZE fails with EFBIG instead of killing the process
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


def _assert_failed_cleanly(proc: subprocess.Popen, ckpt_dir: Path, reason: str) -> str:
    """The run stopped with one error line naming the failed file; the previous checkpoint is intact
    and loadable; nothing partial is left. Returns the run's stdout + stderr."""
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, f"the run should have stopped with an error:\n{err[-3000:]}"
    errors = [line for line in err.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and errors[0].startswith("drivebench: error: writing checkpoint /"), err[-3000:]
    assert "Traceback" not in err
    message = errors[0]
    failed = Path(message.split("writing checkpoint ", 1)[1].split(" failed", 1)[0])
    assert failed.parent == ckpt_dir and step_of(failed.name) is not None
    assert reason in message and "the previous checkpoint is intact" in message

    store = CheckpointStore(str(ckpt_dir))
    names = [n for n in checkpoint_files(ckpt_dir) if not n.startswith(".write-probe")]
    assert failed.name not in names and not any(n.endswith(".partial") for n in names), names
    latest = store.latest_complete()
    assert latest is not None and step_of(Path(latest).name) < step_of(failed.name)
    state = store.load(latest)  # intact, and loadable the way resume loads it
    assert state["global_step"] == step_of(Path(latest).name)
    assert f"resume={latest}" in message and "resume=auto" in message  # the advice names what to continue
    return out + err


def test_file_size_limit_mid_run_keeps_previous_checkpoint(tmp_path, cache):
    """A real write failure (EFBIG): the file-size limit of the running process is lowered below a
    checkpoint's size once the first checkpoint exists, so the next save fails part-way."""
    ckpt_dir = tmp_path / "ckpt"
    proc = start_training(tmp_path / "run", cache, f"ckpt.dir={ckpt_dir}", "ckpt.every_n_steps=3",
                          "+ckpt.storage_options.secret=TOPSECRET123", steps=100, preexec_fn=_children_ignore_sigxfsz)
    first = wait_for_step(ckpt_dir, 3, proc)
    limit = first.stat().st_size // 2
    resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
    output = _assert_failed_cleanly(proc, ckpt_dir, "the disk is full (or a file-size limit was reached)")
    assert "TOPSECRET123" not in output  # a failing run must not echo its overrides (Hydra would)


@pytest.fixture
def small_tmpfs(tmp_path):
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:  # the RLIMIT test above covers the behaviour wherever mounting is refused
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.decode().strip()})")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def test_disk_full_mid_run_keeps_previous_checkpoint(tmp_path, cache, small_tmpfs):
    """A really full filesystem (ENOSPC): a 24 MiB tmpfs passes the preflight (two checkpoints of
    about 7 MB), then something else fills it after the first checkpoint."""
    ckpt_dir = small_tmpfs / "ckpt"
    proc = start_training(tmp_path / "run", cache, f"ckpt.dir={ckpt_dir}", "ckpt.every_n_steps=3",
                          "ckpt.keep_last_k=1", steps=100)
    first = wait_for_step(ckpt_dir, 3, proc)
    free = os.statvfs(small_tmpfs).f_bavail * os.statvfs(small_tmpfs).f_frsize
    filler = small_tmpfs / "filler"
    with open(filler, "wb") as fh:  # leave less than half a checkpoint free
        fh.write(b"\0" * max(free - first.stat().st_size // 2, 0))
    started = time.monotonic()
    _assert_failed_cleanly(proc, ckpt_dir, "the disk is full")
    assert time.monotonic() - started < 300
