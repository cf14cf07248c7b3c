"""Checkpoint directories shared between runs (issue 21, 2): a directory belongs to the run that writes it.

Before: pruning kept the highest step numbers whoever wrote them (a fresh run next to an older run's later
steps deleted its own checkpoints), ``resume=auto`` after a kill continued the older run, two live runs on one
directory overwrote each other's files or died on the same ``.partial`` name with a misleading message.
Now every checkpoint is named after its run (fingerprint + run id), a run prunes only its own files, and a
second live run on a local directory is refused in one line (the directory's lock).
"""

from __future__ import annotations

import hashlib
import signal
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from drivebench.ckpt.checkpoint_io import StorageCheckpointIO
from drivebench.ckpt.identity import RunIdentity
from drivebench.ckpt.store import CheckpointStore, parse_name
from test_ckpt_cli_helpers import checkpoint_files, losses, shared_cache, start_training, summary, train


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return shared_cache(tmp_path_factory)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def by_run(ckpt_dir: Path) -> dict[str, list[int]]:
    """run id -> the steps of its checkpoints in ``ckpt_dir``."""
    runs: dict[str, list[int]] = {}
    for name in checkpoint_files(ckpt_dir):
        parsed = parse_name(name)
        if parsed is not None:
            runs.setdefault(parsed[2], []).append(parsed[0])
    return {run: sorted(steps) for run, steps in runs.items()}


def test_a_fresh_run_beside_an_older_run_keeps_both_a_second_live_run_is_refused_and_resume_auto_continues(
        tmp_path, cache):
    """One directory, three runs: an older run's finished checkpoints; a fresh run of other training that a
    second live run may not join (refused in one line while the fresh run holds the directory: stopped with
    SIGSTOP, still alive) and that is then killed; resume=auto continuing the killed run, not the older one."""
    shared = tmp_path / "shared"
    older = tmp_path / "older"
    train(older, cache, f"ckpt.dir={shared}", "ckpt.every_n_steps=2", "ckpt.keep_last_k=0", "seed=1", steps=8)
    older_files = {name: digest(shared / name) for name in checkpoint_files(shared) if name.startswith("step-")}
    assert len(older_files) == 4  # steps 2, 4, 6, 8

    # a fresh run of other training (another seed) in the same directory
    fresh = tmp_path / "fresh"
    proc = start_training(fresh, cache, f"ckpt.dir={shared}", "ckpt.every_n_steps=2", "seed=2", steps=100)
    wait_for_step_of_run(shared, 2, exclude=set(older_files), proc=proc)
    second = start_training(tmp_path / "second", cache, f"ckpt.dir={shared}", "ckpt.every_n_steps=2", "seed=5",
                            steps=4)  # starts up while the fresh run trains on
    wait_for_step_of_run(shared, 4, exclude=set(older_files), proc=proc)
    proc.send_signal(signal.SIGSTOP)  # alive, holding the directory, writing nothing more
    try:
        _, err = second.communicate(timeout=240)
        assert second.returncode == 2, err[-3000:]
        errors = [line for line in err.splitlines() if line.startswith("drivebench: error:")]
        assert len(errors) == 1 and "Traceback" not in err
        assert errors[0].startswith(f"drivebench: error: ckpt.dir={shared} is in use by another live run "
                                    f"(pid {proc.pid} ")
        assert "its own ckpt.dir=" in errors[0]
        assert not losses(tmp_path / "second")  # refused before its first step
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
    runs = by_run(shared)
    (older_id,) = {parse_name(n)[2] for n in older_files}
    (fresh_id,) = set(runs) - {older_id}  # the second run wrote nothing
    last = runs[fresh_id][-1]
    assert 4 <= last < 8  # below the older run's later steps ...
    assert runs[older_id] == [2, 4, 6, 8]  # ... which do not make it prune its own
    assert len(runs[fresh_id]) <= 2  # keep_last_k=2 of its own
    assert {name: digest(shared / name) for name in older_files} == older_files  # untouched, byte for byte

    # resume=auto continues the killed run (seed 2), not the older run's higher step
    resumed = tmp_path / "resumed"
    train(resumed, cache, f"ckpt.dir={shared}", "ckpt.every_n_steps=2", "seed=2", "resume=auto", steps=last + 2)
    record = summary(resumed)["run"]
    assert parse_name(Path(record["resumed_from"]).name)[:1] == (last,) and record["run_id"] == fresh_id
    assert sorted(losses(resumed)) == [last, last + 1]
    assert by_run(shared) == {older_id: [2, 4, 6, 8], fresh_id: [last, last + 2]}  # its run continued: pruned as one
    assert {name: digest(shared / name) for name in older_files} == older_files


def wait_for_step_of_run(ckpt_dir: Path, step: int, exclude: set[str], proc: subprocess.Popen) -> None:
    """Like wait_for_step, for a directory that already holds another run's checkpoint of ``step``."""
    import time

    deadline = time.monotonic() + 240
    while not [n for n in checkpoint_files(ckpt_dir) if n not in exclude and (parse_name(n) or (0,))[0] == step]:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, f"no step {step} of the new run in {ckpt_dir}"
        time.sleep(0.02)


def test_partial_files_are_unique_per_writer(tmp_path):
    """Two processes writing the same checkpoint name at once (no lock: e.g. a run of an older version)
    both complete: each streams into its own ``.partial``; the file under the final name is complete."""
    script = textwrap.dedent(f"""
        import sys, torch
        from drivebench.ckpt.store import CheckpointStore
        store = CheckpointStore({str(tmp_path)!r})
        for _ in range(3):
            store.write("step-00000001.ckpt", {{"w": torch.full((1_000_000,), float(sys.argv[1]))}})
    """)
    env = {"PYTHONPATH": str(Path(__file__).resolve().parents[1]), "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", script, str(v)], env=env, stderr=subprocess.PIPE, text=True)
             for v in (1, 2)]
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-3000:]
    state = CheckpointStore(str(tmp_path)).load(str(tmp_path / "step-00000001.ckpt"))
    assert float(state["w"][0]) in (1.0, 2.0) and bool((state["w"] == state["w"][0]).all())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000001.ckpt"]


def test_two_runs_on_one_remote_url_prune_only_their_own(tmp_path):
    """An fsspec URL has no lock: two runs there each write their own names and prune only their own files."""
    url = f"memory://shared-{uuid.uuid4().hex[:8]}/ckpt"
    ios = []
    for seed in (1, 2):
        io = StorageCheckpointIO(url, keep_last_k=2)
        io.bind(RunIdentity.of_config({"model": {"name": "toy"}, "seed": seed}, 1))
        ios.append(io)
    for step in range(1, 6):
        for io in ios:  # interleaved, as two live runs would
            io.save_checkpoint({"global_step": step, "state_dict": {}}, io.path_for(step))
    files = CheckpointStore(url).list_checkpoints()
    for io in ios:
        assert [f.step for f in files if f.belongs_to(io.identity)] == [4, 5]
    assert len(files) == 4
