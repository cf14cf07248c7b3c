"""Signals a cluster job meets (issue 21, 1): SIGTERM (preemption), SIGINT (a terminal), SIGUSR1 (SLURM's
warning before the time limit) stop training at the next optimizer-step boundary with a final checkpoint,
a summary with ``status: interrupted`` and the step reached, one line, and exit status 128 + the signal.

Before: SIGTERM exited 0 with nothing written (Lightning's SIGTERMException is a SystemExit), SIGINT exited 1
silently. In-process fits check the step boundary (mid-accumulation) and a second signal; real runs of
``python -m drivebench`` check what a user and a scheduler see, a SLURM requeue and a DDP job.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch

from drivebench.ckpt.store import CheckpointStore, step_of
from drivebench.signals import STOP, Interrupted, RaiseLostStop, StopOnSignal, exit_code, signal_name
from test_ckpt_callback import Toy, ToyData, checkpointing, trainer_for
from test_ckpt_cli_helpers import (loader_position, losses, shared_cache, start_training, step_file, summary, train,
                                   wait_for_step)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return shared_cache(tmp_path_factory)


@pytest.fixture
def handlers():
    """The process's stop-signal handlers, as ``drivebench.app.main`` installs them; restored afterwards."""
    STOP.install()
    try:
        yield STOP
    finally:
        STOP.restore()


class SignalAt(pl.Callback):
    """Sends this process ``signum`` at the end of each listed batch index (as a scheduler would, mid-run)."""

    def __init__(self, signum: int, batches: tuple[int, ...]) -> None:
        self.signum = signum
        self.batches = batches

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        batch_idx = args[-1]
        if batch_idx in self.batches:
            os.kill(os.getpid(), self.signum)


# ---- in-process: the step boundary, the final checkpoint, a second signal ------------------------------
def test_sigterm_mid_accumulation_stops_at_the_next_optimizer_step_with_a_checkpoint(tmp_path, handlers):
    """Two batches per optimizer step; SIGTERM after batch 2 (half of step 2): training stops after batch 3,
    at global step 2, and the final checkpoint is step 2's, though save_last is off."""
    ckpt = checkpointing(str(tmp_path / "ckpt"), save_last=False)
    stop = StopOnSignal(handlers)
    pl.seed_everything(7, verbose=False)
    trainer = trainer_for(tmp_path, ckpt, callbacks=[stop, SignalAt(signal.SIGTERM, (2,))], max_steps=100,
                          accumulate_grad_batches=2)
    trainer.fit(Toy(), datamodule=ToyData())  # returns: the stop is graceful
    assert stop.stopped == {"signal": "SIGTERM", "signum": signal.SIGTERM, "step": 2}
    assert trainer.global_step == 2 and handlers.stopping() == signal.SIGTERM
    assert [s["step"] for s in ckpt.io.saves] == [2]
    state = CheckpointStore(str(tmp_path / "ckpt")).load(ckpt.io.saves[0]["path"])
    assert state["global_step"] == 2
    assert state["loops"]["fit_loop"]["state_dict"]["combined_loader"] == [{"epoch": 0, "batches_done": 4}]


def test_a_second_signal_stops_at_once(tmp_path, handlers):
    """The first SIGINT is deferred to the step boundary; a second one during the same step raises at once."""

    class Twice(pl.Callback):
        def on_train_batch_start(self, trainer: pl.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
            if batch_idx == 1:
                os.kill(os.getpid(), signal.SIGINT)  # deferred: training goes on to the boundary
                assert handlers.received == signal.SIGINT
                os.kill(os.getpid(), signal.SIGINT)  # again: now

    pl.seed_everything(7, verbose=False)
    trainer = trainer_for(tmp_path, None, callbacks=[StopOnSignal(handlers), Twice()], max_steps=100)
    with pytest.raises(Interrupted) as stopped:
        trainer.fit(Toy(), datamodule=ToyData())
    assert stopped.value.signum == signal.SIGINT and stopped.value.exit_code == 130
    assert trainer.global_step == 1 and handlers.deferring == 0
    assert handlers.count == 2  # the stop line says "a second signal" only then (else: a failure after the signal)


def test_a_signal_during_validation_in_fit_stops_at_its_end_before_another_training_step(tmp_path, handlers):
    """Validation every 3 optimizer steps; SIGTERM in the second one (after step 6): training stops when that
    validation ends, at step 6, with step 6's checkpoint; no seventh training step runs first."""

    class Validated(Toy):
        def validation_step(self, batch: Any, batch_idx: int) -> None:
            self.log("val/loss", torch.nn.functional.mse_loss(self.net(batch[0]), batch[1]))

    class Data(ToyData):
        def val_dataloader(self) -> Any:
            return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(self.x, self.y), batch_size=8)

    class SignalInValidation(pl.Callback):
        def __init__(self) -> None:
            self.validations = 0

        def on_validation_start(self, trainer: pl.Trainer, pl_module: Any) -> None:
            self.validations += 1
            if self.validations == 2:
                os.kill(os.getpid(), signal.SIGTERM)

    ckpt = checkpointing(str(tmp_path / "ckpt"), save_last=False)
    stop = StopOnSignal(handlers)
    pl.seed_everything(7, verbose=False)
    module = Validated()
    trainer = trainer_for(tmp_path, ckpt, callbacks=[stop, SignalInValidation()], max_steps=100,
                          limit_val_batches=2, val_check_interval=3)
    trainer.fit(module, datamodule=Data())
    assert stop.stopped == {"signal": "SIGTERM", "signum": signal.SIGTERM, "step": 6}
    assert trainer.global_step == 6 and sorted(module.losses) == [0, 1, 2, 3, 4, 5]
    assert [s["step"] for s in ckpt.io.saves] == [6]


def test_outside_training_a_signal_raises_where_the_program_is(handlers):
    with pytest.raises(Interrupted) as stopped:
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(1)  # the handler runs here
    assert stopped.value.signum == signal.SIGUSR1 and exit_code(signal.SIGUSR1) == 138


def _maptr_run(tmp_path: Path, cache: Path) -> Any:
    """A real MapTR run (test size, ``accel=none``, no checkpoints) built as ``drivebench.app`` builds it."""
    from drivebench.app import build_run
    from drivebench.compose import compose

    cfg = compose(["model=maptr", "accel=none", "ckpt=none", f"paths.cache={cache}", f"paths.output_dir={tmp_path}"])
    return build_run(cfg, tmp_path, progress=False)


@pytest.mark.parametrize("signalled", [True, False], ids=["after-a-signal", "no-signal"])
def test_a_failure_after_a_lost_signal_ends_the_run_as_interrupted(tmp_path, cache, handlers, monkeypatch, signalled):
    """A scheduler's SIGTERM to the whole process group while validation forks its loader workers: the
    handler's Interrupted is raised inside logging's at-fork hook, which ignores exceptions, and the next
    failure is the dead workers' RuntimeError (seen on the H200, 2026-12-02). The run still ends as
    interrupted, with its summary and one line, not as a failed run with a traceback; the same failure
    with no signal received stays a failure."""
    from drivebench.bench.runners import TrainBench

    run = _maptr_run(tmp_path, cache)
    bench = TrainBench(steps=2, warmup_steps=0, ceiling=False, val_batches=1)

    def workers_died(*args: Any) -> None:
        if signalled:
            handlers.received = signal.SIGTERM  # what the handler recorded before its exception was swallowed
        raise RuntimeError("DataLoader worker (pid(s) 4242) exited unexpectedly")

    monkeypatch.setattr(bench, "_validate", workers_died)
    if not signalled:
        with pytest.raises(RuntimeError, match="exited unexpectedly"):
            bench.run(run)
        # a failure, not a stop: the summary written when training started says so, with the error's line
        failed = json.loads((tmp_path / "summary.json").read_text())["run"]
        assert failed["status"] == "failed" and failed["error"].startswith("RuntimeError: DataLoader worker (pid(s) 4242)")
        return
    with pytest.raises(Interrupted) as stopped:
        bench.run(run)
    assert stopped.value.signum == signal.SIGTERM
    assert "during validation (training reached step 2)" in stopped.value.message
    written = json.loads((tmp_path / "summary.json").read_text())
    assert written["run"]["status"] == "interrupted" and written["run"]["interrupted"]["step"] == 2
    assert written["train"]["steps_measured"] == 2


_SIGNAL_AT_FORK: list[int] = []  # armed by the test below: the next fork in this process signals it


def _signal_in_the_at_fork_hook() -> None:
    if _SIGNAL_AT_FORK:
        os.kill(os.getpid(), _SIGNAL_AT_FORK.pop())


os.register_at_fork(after_in_parent=_signal_in_the_at_fork_hook)


class _Batches(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.full((2,), float(index))


class _Scored(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.scored: list[int] = []

    def validation_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        self.scored.append(batch_idx)


def test_a_signal_lost_in_an_at_fork_hook_still_stops_validation_at_its_first_batch(handlers):
    """A SIGTERM while validation forks its loader workers: the handler's Interrupted is raised inside the at-fork
    hook, where Python prints "Exception ignored" and carries on with the signal recorded. Without the check at
    each batch start the validation went on to the scheduler's SIGKILL on the H100 (b48: a capped SparseDrive run's
    end-of-run validation, killed 20 s after the SIGTERM with no summary); Lightning 2.6 raises its own
    SIGTERMException at the next batch instead, a SystemExit that would end the process with status 0."""
    module = _Scored()
    trainer = pl.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[RaiseLostStop()])
    loader = torch.utils.data.DataLoader(_Batches(), batch_size=2, num_workers=1)
    _SIGNAL_AT_FORK.append(signal.SIGTERM)
    with pytest.raises(Interrupted) as stopped:
        trainer.validate(module, loader, verbose=False)
    assert stopped.value.signum == signal.SIGTERM and module.scored == []


def test_a_signal_lost_while_the_end_of_run_validation_forks_ends_the_run_as_interrupted(tmp_path, cache, handlers,
                                                                                          monkeypatch):
    """The same loss inside the bench's end-of-run validation of a real run: it ends as interrupted, with its
    summary and the step training reached, before validation scores a batch. (The signal is recorded as the
    handler records it before its exception is swallowed; the real loss in a fork is the test above: forking
    beside this run's monitor thread would risk CPython gh-112275's hang on this CI's Python.)"""
    from drivebench.bench.runners import TrainBench

    run = _maptr_run(tmp_path, cache)
    bench = TrainBench(steps=2, warmup_steps=0, ceiling=False, val_batches=2)
    validate, scored = bench._validate, []

    def signal_lost_as_it_starts(*args: Any) -> dict[str, float]:
        handlers.received = signal.SIGTERM  # what the handler recorded before its exception was swallowed
        monkeypatch.setattr(run.module, "validation_step", lambda *a, **k: scored.append(a))
        return validate(*args)

    monkeypatch.setattr(bench, "_validate", signal_lost_as_it_starts)
    with pytest.raises(Interrupted) as stopped:
        bench.run(run)
    assert stopped.value.signum == signal.SIGTERM and scored == []
    assert "during validation (training reached step 2)" in stopped.value.message
    written = json.loads((tmp_path / "summary.json").read_text())
    assert written["run"]["status"] == "interrupted" and written["run"]["interrupted"]["step"] == 2


def test_a_signal_lost_while_the_loader_benchmark_starts_ends_the_run_as_interrupted(tmp_path, cache, handlers,
                                                                                       monkeypatch):
    """``bench=loader`` iterates the loader outside any Trainer: its loop checks for a lost stop as well, before
    it times a batch."""
    from drivebench.bench.runners import LoaderBench

    run = _maptr_run(tmp_path, cache)
    bench = LoaderBench(steps=2, warmup_steps=0, ceiling=False, val_batches=0, loader_batches=4)
    loader, fetched = run.datamodule.train_dataloader, []

    def signal_lost_as_it_starts(*args: Any, **kwargs: Any) -> Any:
        handlers.received = signal.SIGTERM  # recorded, its exception swallowed (the first test's fork)
        batches = loader(*args, **kwargs)
        return map(lambda batch: fetched.append(1) or batch, batches)

    monkeypatch.setattr(run.datamodule, "train_dataloader", signal_lost_as_it_starts)
    with pytest.raises(Interrupted) as stopped:
        bench.run(run)
    assert stopped.value.signum == signal.SIGTERM and fetched == []


# ---- python -m drivebench -------------------------------------------------------------------------------
def _stopped_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("drivebench: ")]
    assert len(lines) == 1, err[-3000:]
    assert "Traceback" not in err and "error" not in lines[0]
    return lines[0]


BATCHES_PER_EPOCH = 8  # QCNet test on the mini Argoverse 2 set at batch 4 (test_ckpt_resume.py)


def test_sigterm_writes_checkpoint_and_summary_exits_143_then_resume_auto_continues(tmp_path, cache):
    run_dir, ckpt_dir = tmp_path / "run", tmp_path / "ckpt"
    proc = start_training(run_dir, cache, f"ckpt.dir={ckpt_dir}", "ckpt.every_n_steps=3", steps=200)
    wait_for_step(ckpt_dir, 3, proc)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-3000:]
    line = _stopped_line(err)
    record = summary(run_dir)["run"]
    assert record["status"] == "interrupted"
    stop = record["interrupted"]
    step = stop["step"]
    assert stop["signal"] == "SIGTERM" and stop["exit_code"] == 143 and stop["at_step_boundary"] is True
    assert 3 <= step < 200
    final = step_file(ckpt_dir, step)
    assert final is not None and stop["checkpoint"] == str(final)
    assert CheckpointStore(str(ckpt_dir)).load(str(final))["global_step"] == step
    assert f"stopped by SIGTERM at step {step}" in line and str(final) in line and "resume=auto" in line
    assert sorted(losses(run_dir)) == list(range(step))  # every step logged up to the stop
    assert "ceiling" not in summary(run_dir) and "val" not in summary(run_dir)  # nothing ran after the stop

    resumed = tmp_path / "resumed"
    train(resumed, cache, f"ckpt.dir={ckpt_dir}", "ckpt.every_n_steps=3", "resume=auto", steps=step + 2)
    after = summary(resumed)
    assert after["run"]["resumed_from"] == str(final) and after["run"]["status"] == "completed"
    assert sorted(losses(resumed)) == [step, step + 1]
    # the rest of the epoch the signal stopped in is trained, not skipped: the stream stands where an
    # uninterrupted run would (the mini set: 8 batches per epoch); the final checkpoint once said that epoch was done
    last = CheckpointStore(str(ckpt_dir)).load(str(step_file(ckpt_dir, step + 2)))
    assert loader_position(last) == divmod(step + 2, BATCHES_PER_EPOCH)


def _fake_scontrol(bin_dir: Path, log: Path) -> None:
    """A stand-in for SLURM's scontrol on PATH: records its arguments."""
    bin_dir.mkdir()
    script = bin_dir / "scontrol"
    script.write_text(f"#!/bin/sh\necho \"$@\" >> {log}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


def test_sigint_without_checkpoints_and_sigusr1_requeue_side_by_side(tmp_path, cache):
    """SIGINT with ckpt=none: exit 130, a summary, no checkpoint. SIGUSR1 under SLURM with requeue=true (SLURM
    sends it with sbatch --signal before the time limit): exit 138, a final checkpoint though only save_last
    would save, and ``scontrol requeue <job>``."""
    log = tmp_path / "scontrol.log"
    _fake_scontrol(tmp_path / "bin", log)
    runs = {
        "sigint": start_training(tmp_path / "sigint", cache, "ckpt=none", steps=200),
        "sigusr1": start_training(tmp_path / "sigusr1", cache, "requeue=true", "resume=auto",
                                  f"paths.outputs_root={tmp_path / 'nothing'}", steps=200,
                                  env={"SLURM_JOB_ID": "4242", "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}),
    }
    for name, signum in (("sigint", signal.SIGINT), ("sigusr1", signal.SIGUSR1)):
        events = tmp_path / name / "tb"
        deadline = time.monotonic() + 240
        while not (events.is_dir() and losses(tmp_path / name)):  # training has begun
            assert runs[name].poll() is None and time.monotonic() < deadline, runs[name].communicate()[1][-3000:]
            time.sleep(0.5)
        runs[name].send_signal(signum)
    outcome = {name: (proc.communicate(timeout=120), proc.returncode) for name, proc in runs.items()}

    (_, err), code = outcome["sigint"]
    assert code == 130, err[-3000:]
    line = _stopped_line(err)
    stop = summary(tmp_path / "sigint")["run"]["interrupted"]
    assert stop["signal"] == "SIGINT" and stop["checkpoint"] is None and stop["requeue"] is None
    assert f"stopped by SIGINT at step {stop['step']}" in line and "checkpoints are off" in line

    (_, err), code = outcome["sigusr1"]
    assert code == 138, err[-3000:]
    line = _stopped_line(err)
    stop = summary(tmp_path / "sigusr1")["run"]["interrupted"]
    assert stop["signal"] == "SIGUSR1" and stop["requeue"] == "SLURM job 4242 requeued"
    assert stop["checkpoint"] and Path(stop["checkpoint"]).parent == tmp_path / "sigusr1" / "checkpoints"
    assert step_of(Path(stop["checkpoint"]).name) == stop["step"]
    assert log.read_text().split() == ["requeue", "4242"] and "SLURM job 4242 requeued" in line


def test_a_signal_to_the_whole_process_group_still_stops_at_a_step_boundary(tmp_path, cache):
    """GNU timeout, ``kill -<pgid>``, SLURM's scancel and Ctrl-C signal every process of the group, loader
    workers included: torch's workers died on it (SIGTERM) or ended (SIGINT) and the training process lost its
    loader mid-step (then reported as "a second signal: not at a step boundary", H200 b37). The workers leave it to
    the run."""
    runs = {signum: start_training(tmp_path / signal_name(signum), cache, "ckpt=none", "accel.num_workers=2",
                                   "accel.persistent_workers=true", steps=400, start_new_session=True)
            for signum in (signal.SIGTERM, signal.SIGINT)}
    for signum, proc in runs.items():
        deadline = time.monotonic() + 240
        while len(losses(tmp_path / signal_name(signum))) < 3:  # training has begun, workers feeding it
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
            time.sleep(0.5)
        os.killpg(proc.pid, signum)
    for signum, proc in runs.items():
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == exit_code(signum), err[-3000:]
        stop = summary(tmp_path / signal_name(signum))["run"]["interrupted"]
        assert stop["at_step_boundary"] is True, err[-3000:]
        assert f"stopped by {signal_name(signum)} at step {stop['step']}" in _stopped_line(err)
        assert "DataLoader worker" not in err


# requeue=true without resume=auto is refused in one line with exit 2 before any work: one of the bad values
# that tests/test_faults_config.py gives the drivebench command (``("requeue=true", ...)``)


DDP = ["model=maptr", "model.size=test", "model.batch_size=2", "data.size=mini", "accel=none", "bench.warmup_steps=0",
       "bench.val_batches=0", "bench.ceiling=false", "trainer.log_every_n_steps=1", "dist=ddp", "dist.devices=2"]


def test_ddp_sigterm_to_rank_0_only_stops_both_ranks_at_one_step(tmp_path, cache):
    """Kubernetes signals the container's first process only: rank 0 passes the signal on to the rank it
    launched; both stop at the same optimizer step (one save, every rank in it), exit 143, no rank reported
    as failed."""
    run_dir, ckpt_dir = tmp_path / "run", tmp_path / "ckpt"
    env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "WORLD_SIZE", "RANK")}
    env.update({"DRIVEBENCH_CACHE": str(cache), "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
                "OMP_NUM_THREADS": "1"})
    proc = subprocess.Popen([sys.executable, "-m", "drivebench", *DDP, "trainer.max_steps=400",
                             f"ckpt.dir={ckpt_dir}", "ckpt.every_n_steps=2", f"hydra.run.dir={run_dir}"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_step(ckpt_dir, 2, proc, timeout=300)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 143, err[-3000:]
    assert "exited with code" not in err and "was killed by signal" not in err, err[-3000:]
    record = json.loads((run_dir / "summary.json").read_text())["run"]
    stop = record["interrupted"]
    assert record["status"] == "interrupted" and stop["at_step_boundary"] is True
    assert stop["checkpoint"] == str(step_file(ckpt_dir, stop["step"]))
    assert f"stopped by SIGTERM at step {stop['step']}" in _stopped_line(err)
