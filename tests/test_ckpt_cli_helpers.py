"""Helpers shared by the checkpoint tests that run ``python -m drivebench`` in a subprocess (no tests here).

Every run is QCNet `test` (the CPU test size) on the mini Argoverse 2 set, accel=none, warm-up 0, no ceiling, no
validation, ``train/loss`` logged every step. Subprocesses run with one intra-op thread: the
arithmetic is then the same in every run whatever else the machine does, so a resumed run and an
uninterrupted one can be compared step for step.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import session_cache

REPO = Path(__file__).resolve().parents[1]
TRAIN = ["model=qcnet", "model.size=test", "data.size=mini", "accel=none", "bench.ceiling=false",
         "bench.val_batches=0", "trainer.log_every_n_steps=1", "bench.warmup_steps=0"]
LOSS_TOLERANCE = 1e-5  # absolute; observed: bit-identical (0.0) with one thread in every run


def loader_position(checkpoint: dict[str, Any]) -> tuple[int, int]:
    """(epoch, batches done) of the training loader as Lightning saved it in ``checkpoint`` (the
    stateful loader's ``state_dict`` in the fit loop's state)."""
    (state,) = checkpoint["loops"]["fit_loop"]["state_dict"]["combined_loader"]
    return int(state["epoch"]), int(state["batches_done"])


def shared_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One DRIVEBENCH_CACHE per pytest session (every module's fixture returns the same folder)."""
    return session_cache(tmp_path_factory)


def cli_env(cache: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRIVEBENCH_FAULT")}
    env.update({"DRIVEBENCH_CACHE": str(cache), "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
                "MKL_NUM_THREADS": "1", "HYDRA_FULL_ERROR": "1"})
    env.update(extra or {})
    return env


def command(args: list[str]) -> list[str]:
    return [sys.executable, "-m", "drivebench", *args]


def run_cli(args: list[str], cache: Path, cwd: Path, env: dict[str, str] | None = None,
            timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(command(args), cwd=cwd, env=cli_env(cache, env), capture_output=True, text=True,
                          timeout=timeout)


def train(run_dir: Path, cache: Path, *extra: str, steps: int, env: dict[str, str] | None = None,
          expect_ok: bool = True) -> subprocess.CompletedProcess:
    """A training run in ``run_dir`` (the Hydra run directory)."""
    args = [*TRAIN, f"hydra.run.dir={run_dir}", f"bench.steps={steps}", *extra]
    proc = run_cli(args, cache, cwd=run_dir.parent, env=env)
    if expect_ok:
        assert proc.returncode == 0, f"drivebench {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def start_training(run_dir: Path, cache: Path, *extra: str, steps: int, env: dict[str, str] | None = None,
                   **popen: Any) -> subprocess.Popen:
    """The same run started in the background (to be killed or limited while it trains)."""
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    args = [*TRAIN, f"hydra.run.dir={run_dir}", f"bench.steps={steps}", *extra]
    return subprocess.Popen(command(args), cwd=run_dir.parent, env=cli_env(cache, env), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **popen)


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 240) -> None:
    """Poll until ``path`` exists; fail (with the run's output) if the run ends first."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the run ended (rc {proc.returncode}) before {path} appeared:\n{out[-2000:]}\n{err[-3000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"{path} did not appear within {timeout} s")
        time.sleep(0.02)


def step_file(ckpt_dir: Path, step: int) -> Path | None:
    """The complete checkpoint of ``step`` in ``ckpt_dir`` (its name also carries the run's identity:
    ``step-<step>-<fingerprint>-<run id>.ckpt``), or None."""
    found = sorted(ckpt_dir.glob(f"step-{step:08d}*.ckpt")) if ckpt_dir.is_dir() else []
    assert len(found) <= 1, f"several checkpoints of step {step} in {ckpt_dir}: {found}"
    return found[0] if found else None


def wait_for_step(ckpt_dir: Path, step: int, proc: subprocess.Popen, timeout: float = 240) -> Path:
    """Poll until the checkpoint of ``step`` is complete in ``ckpt_dir``; fail if the run ends first."""
    deadline = time.monotonic() + timeout
    while (found := step_file(ckpt_dir, step)) is None:
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the run ended (rc {proc.returncode}) before step {step}'s checkpoint appeared in "
                        f"{ckpt_dir}:\n{out[-2000:]}\n{err[-3000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"step {step}'s checkpoint did not appear in {ckpt_dir} within {timeout} s")
        time.sleep(0.02)
    return found


def checkpoint_files(ckpt_dir: Path) -> list[str]:
    """The names in ``ckpt_dir`` but the run's lock file (``.drivebench.lock``, which stays)."""
    return sorted(p.name for p in ckpt_dir.iterdir() if p.name != ".drivebench.lock")


def summary(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "summary.json").read_text())


def scalars(run_dir: Path, tag: str) -> dict[int, float]:
    """step -> value of one TensorBoard scalar series of the run (every event file under tb/)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    values: dict[int, float] = {}
    for events in sorted((run_dir / "tb").rglob("events.out.tfevents.*")):
        acc = EventAccumulator(str(events), size_guidance={"scalars": 0})
        acc.Reload()
        if tag in acc.Tags()["scalars"]:
            for event in acc.Scalars(tag):
                values[event.step] = event.value
    return values


def losses(run_dir: Path) -> dict[int, float]:
    return scalars(run_dir, "fit/train/loss")  # the training phase's (the ceiling logs ceiling/train/loss)


def assert_same_losses(resumed: dict[int, float], baseline: dict[int, float], first_step: int, last_step: int) -> None:
    """The resumed run logged exactly the steps first_step..last_step-1, each as the baseline did."""
    assert sorted(resumed) == list(range(first_step, last_step)), f"steps logged after resume: {sorted(resumed)}"
    diffs = {s: abs(resumed[s] - baseline[s]) for s in resumed}
    worst = max(diffs.values())
    assert worst <= LOSS_TOLERANCE, (f"losses after resume differ from the uninterrupted run by up to {worst:.3g}: "
                                     f"{ {s: (resumed[s], baseline[s]) for s in resumed} }")
