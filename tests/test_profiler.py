"""bench.profile on a real CPU Lightning run: the window's placement, the trace file, the summary
block and the TensorBoard scalars."""

import json
from pathlib import Path

import pytest
import lightning.pytorch as pl
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from torch.utils.data import DataLoader

from drivebench.schemas import resolve_profile
from drivebench.errors import ConfigError
from drivebench.perf.callback import StepTimer
from drivebench.perf.loader_wait import LoaderWaitProfiler
from drivebench.perf.profiler import ProfileSteps
from drivebench.perf.summary import phase_stats, render_table
from drivebench.perf.trace_analysis import DATA_WAIT_ANNOTATION, load_trace
from drivebench.report.events import read_scalars
from test_bottleneck import Linear, Samples, Toy
from tests.conftest import run_cli


class TraceOnDisk(pl.Callback):
    """Whether the trace file is complete on disk after each step (and no partial file is left beside it)."""

    def __init__(self, trace_dir: Path) -> None:
        self.trace_dir, self.seen = trace_dir, []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        files = sorted(p.name for p in self.trace_dir.glob("*")) if self.trace_dir.exists() else []
        self.seen.append(files)


def fit(tmp_path, max_steps: int, profile: int = 3, warmup: int = 2, logger=False, extra=()):
    torch.set_num_threads(1)
    module = Toy(Linear(), optimizer=lambda p: torch.optim.SGD(p, lr=0.01))
    profiler = ProfileSteps(profile, warmup, tmp_path)
    timer = StepTimer("perf", warmup_steps=warmup, profiled_steps=profiler.occupied_steps)
    trainer = pl.Trainer(accelerator="cpu", max_steps=max_steps, logger=logger, callbacks=[profiler, timer, *extra],
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         profiler=LoaderWaitProfiler(), default_root_dir=str(tmp_path))
    trainer.fit(module, train_dataloaders=DataLoader(Samples(delay=0.002), batch_size=4))
    return profiler, timer


def test_profile_window_trace_and_block(tmp_path):
    logger = TensorBoardLogger(str(tmp_path), name="tb", version="")
    profiler, timer = fit(tmp_path, max_steps=10, logger=logger)
    flags = [(r.warmup, r.profiled) for r in timer.times.records]
    # 2 warm-up steps, then the profiler's warm-up step and 3 recorded ones, then 4 measured steps
    assert flags == [(True, False)] * 2 + [(False, True)] * 4 + [(False, False)] * 4
    stats = phase_stats(timer.times)
    assert stats["steps_measured"] == 4 and stats["warmup_steps"] == 2 and stats["profiled_steps"] == 4

    path = tmp_path / "tb" / "profile" / "rank0.pt.trace.json.gz"
    assert profiler.trace_path == path and path.stat().st_size > 0
    events = load_trace(path)["traceEvents"]
    steps = sorted(e["name"] for e in events if str(e.get("name", "")).startswith("ProfilerStep#"))
    assert steps == ["ProfilerStep#3", "ProfilerStep#4", "ProfilerStep#5"]  # training steps 3, 4, 5
    assert sum(e.get("name") == DATA_WAIT_ANNOTATION for e in events) >= 3  # the loader's next() is marked

    block = profiler.summarise(timer.times, None, logger, step=10)
    assert block["steps"] == 3 and block["first_step"] == 3 and block["activities"] == ["CPU"]
    assert block["device"] == "cpu" and block["gpu"] is None and "not measured" in block["gpu_note"]
    assert block["host"]["aten_ops_per_step"] > 0 and block["top_ops"]
    assert block["compare"]["profiled_over_measured_step_time"] > 0
    assert block["compare"]["nvml_gpu_busy_pct_median"] is None
    rows = render_table({"profile": block})
    assert "profile (steps, trace)" in rows and "no CUDA kernels" in rows

    logger.finalize("success")
    scalars, errors = read_scalars(sorted((tmp_path / "tb").glob("events.out.tfevents*")))
    assert not errors
    assert {"profile/aten_ops_per_step", "profile/aten_op_s_per_step"} <= set(scalars["tag"])


def test_trace_is_written_when_the_window_ends_not_after_training(tmp_path):
    """A run stopped after its window (a time limit, SIGTERM) keeps the trace: it is on disk, whole, from the
    step after the last recorded one (training step 6 here), and only under its final name."""
    on_disk = TraceOnDisk(tmp_path / "tb" / "profile")
    profiler, _ = fit(tmp_path, max_steps=10, extra=[on_disk])
    assert on_disk.seen[:5] == [[]] * 5  # warm-up, the profiler's warm-up, two recorded steps
    assert on_disk.seen[5:] == [["rank0.pt.trace.json.gz"]] * 5  # the third recorded step wrote it
    assert load_trace(profiler.trace_path)["traceEvents"] and profiler.export_s > 0


def test_window_past_the_end_of_training_says_so(tmp_path):
    profiler, timer = fit(tmp_path, max_steps=2)  # training ends inside warm-up
    block = profiler.summarise(timer.times)
    assert profiler.trace_path is None and "steps" not in block
    assert "raise trainer.max_steps" in block["note"]


def test_window_cut_short_is_still_written(tmp_path):
    profiler, timer = fit(tmp_path, max_steps=5)  # warm-up 2, profiler warm-up 1, then 2 of 3 recorded
    block = profiler.summarise(timer.times)
    assert block["steps"] == 2 and block["requested_steps"] == 3


@pytest.mark.parametrize("value, steps", [(None, 0), (0, 0), (False, 0), (5, 5)])
def test_profile_key_values(value, steps):
    assert resolve_profile(value) == steps


@pytest.mark.parametrize("value", [-1, "5", 2.5, True])
def test_profile_key_rejects(value):
    with pytest.raises(ConfigError, match=r"bench.profile=.* is not valid"):
        resolve_profile(value)


def test_cli_run_with_bench_profile_writes_a_trace_and_a_verdict(drivebench_cache: Path, tmp_path: Path):
    proc = run_cli(["model=qcnet", "model.size=test", "data.size=mini", "bench.profile=2", "bench.warmup_steps=2",
                    "trainer.max_steps=8", "bench.val_batches=0", "bench.ceiling=false", "ckpt=none",
                    f"hydra.run.dir={tmp_path}"], drivebench_cache)
    assert proc.returncode == 0, proc.stderr[-3000:]
    s = json.loads((tmp_path / "summary.json").read_text())
    trace = tmp_path / "tb" / "profile" / "rank0.pt.trace.json.gz"
    assert s["profile"]["trace"] == str(trace) and trace.stat().st_size > 0
    assert s["profile"]["steps"] == 2 and s["profile"]["gpu"] is None and s["settings"]["profile_steps"] == 2
    assert s["train"]["profiled_steps"] == 3 and s["train"]["steps_measured"] == 3
    assert s["bottleneck"]["verdict"] and s["bottleneck"]["evidence"]
    assert "profile (steps, trace)" in proc.stdout and "bottleneck" in proc.stdout
