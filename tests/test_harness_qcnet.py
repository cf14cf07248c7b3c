"""The harness end to end with QCNet (size test) on the embedded Argoverse 2 set: a real
``python -m drivebench`` run, its summary.json and TensorBoard events, every accel preset, and the
knobs that must not change what the model learns."""

from __future__ import annotations

import json
import math
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from hydra import compose, initialize_config_dir

from drivebench.app import build_run
from drivebench.perf.bottleneck import VERDICTS
from tests.conftest import REPO, run_cli

TEST_SIZE = ["model=qcnet", "model.size=test", "data.size=mini"]
FAST = ["bench.val_batches=0", "bench.ceiling=false", "ckpt=none"]


# 24 steps: enough for the loss to fall (the mean of the last five steps was 0.6x the first five's at step 24,
# against the test's 0.8; seeded, one thread) and for every phase's records; 40 steps cost 10 s more
@pytest.fixture(scope="module")
def full_run(drivebench_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("qcnet-full")
    proc = run_cli([*TEST_SIZE, "accel=none", "trainer.max_steps=24", "bench.warmup_steps=5", "bench.val_batches=4",
                    "bench.ceiling_steps=6", "bench.ceiling_warmup_steps=2", f"hydra.run.dir={run_dir}"],
                   drivebench_cache)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "drivebench run summary" in proc.stdout
    return run_dir


def test_summary_has_every_documented_field_with_sane_values(full_run: Path):
    s = json.loads((full_run / "summary.json").read_text())
    documented = [line.split("|")[1].strip().strip("`") for line in (REPO / "docs" / "summary.md").read_text()
                  .split("A phase (`train`, `ceiling`) holds:")[0].splitlines() if line.startswith("| `")]
    # other benches, DDP, ckpt=none, bench.profile, an efficiency above 100%, accel=auto
    optional = {"loader", "ranks", "dist", "checkpoints", "profile", "efficiency_note", "autotune",
                "experiment", "skipped"}  # + named sweeps: their keys, and a job skipped for want of devices
    for key in documented:
        if key not in optional:
            assert key in s, f"summary.json lacks documented key {key!r}"
    assert s["schema_version"] == 1 and s["run"]["status"] == "completed"
    assert s["run"]["model"] == "qcnet" and s["run"]["accel"] == "none"
    assert s["machine"]["cpu_cores"] >= 1 and s["machine"]["accelerator"] == "cpu"
    train = s["train"]
    assert train["steps_measured"] == 19 and train["warmup_steps"] == 5
    assert train["samples_per_s"] > 0 and 0 <= train["data_wait_fraction"] < 1
    for key in ("step_s", "data_wait_s", "h2d_s", "compute_s"):
        d = train[key]
        assert d["n"] == 19 and d["p10"] <= d["median"] <= d["p90"], key
    assert train["compute_s"]["median"] <= train["step_s"]["median"] * 1.01
    assert train["system"]["cpu_main_pct"]["n"] >= 0
    assert s["ceiling"]["steps_measured"] == 6 and s["ceiling"]["samples_per_s"] > 0
    assert s["efficiency"] == pytest.approx(train["samples_per_s"] / s["ceiling"]["samples_per_s"])
    assert s["data"]["train_samples"] > 0 and s["data"]["embedded"] is True
    assert s["settings"]["accel"]["num_workers"] == 0 and s["settings"]["numerics_changed_by"] == []
    assert s["settings"]["parameters"] > 0
    for key in ("minADE", "minFDE", "MR", "brier_minFDE", "cv_minFDE"):
        assert math.isfinite(s["val"][key]), key
    assert s["config"]["model"]["name"] == "qcnet"
    assert s["bottleneck"]["verdict"] in VERDICTS and s["bottleneck"]["evidence"] and s["bottleneck"]["next"]
    assert (s["efficiency"] > 1) == ("efficiency_note" in s)


def test_loss_falls(full_run: Path):
    loss = json.loads((full_run / "summary.json").read_text())["loss"]
    assert loss["final"] < 0.8 * loss["first"], loss
    assert loss["nonfinite_steps"] == 0


def test_tensorboard_events_hold_the_perf_scalars(full_run: Path):
    """One event stream for the run's three phases, the phase at the head of every tag."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    files = sorted((full_run / "tb").rglob("events.out.tfevents.*"))
    assert len(files) == 1, f"one event stream per run, found {files}"
    acc = EventAccumulator(str(files[0]), size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    for tag in ("fit/perf/step_time_s", "fit/perf/data_wait_s", "fit/perf/h2d_s", "fit/perf/compute_s",
                "fit/perf/samples_per_s", "fit/perf/cpu_main_pct", "fit/train/loss", "ceiling/perf/step_time_s",
                "validate/val/minFDE"):
        assert tag in tags, f"{tag} missing from {sorted(tags)}"
    assert all(tag.split("/", 1)[0] in ("fit", "ceiling", "validate") for tag in tags), sorted(tags)
    assert len(acc.Scalars("fit/perf/step_time_s")) == 24  # one point per training step
    assert len(acc.Scalars("ceiling/perf/step_time_s")) == 8  # 2 warm-up + 6 measured ceiling steps
    assert [e.step for e in acc.Scalars("validate/val/minFDE")] == [24]  # at the step of the weights it scored


PRESETS = ["none", "cpu", "torch", "max"]


@pytest.fixture(scope="module")
def preset_sweep(drivebench_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every preset as one Hydra multirun: one process start-up instead of four (each run is a job)."""
    sweep = tmp_path_factory.mktemp("presets") / "sweep"
    proc = run_cli(["-m", *TEST_SIZE, f"accel={','.join(PRESETS)}", "trainer.max_steps=3", "bench.warmup_steps=1",
                    *FAST, f"hydra.sweep.dir={sweep}"], drivebench_cache)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return sweep


@pytest.mark.parametrize("preset", PRESETS)
def test_every_accel_preset_runs(preset: str, preset_sweep: Path):
    found = [json.loads(p.read_text()) for p in preset_sweep.glob("*/summary.json")]
    mine = [s for s in found if s["run"]["accel"] == preset]
    assert len(found) == len(PRESETS) and len(mine) == 1, sorted(s["run"]["accel"] for s in found)
    s = mine[0]
    assert s["run"]["status"] == "completed" and s["train"]["steps_measured"] == 2
    if preset == "max":  # prefetch_across_epochs: one loader iterator for the whole run
        assert s["data"]["epoch_stream"]["iterator_starts"] == 1


# ---- knobs that only move work around must not change what the model learns -------------------
class _Recorder(pl.Callback):
    def __init__(self) -> None:
        self.steps: list[tuple[list[str], float]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.steps.append((list(batch["scenario_id"]), float(outputs["loss"])))


def _train(cache: Path, tmp: Path, overrides: list[str], steps: int = 6) -> list[tuple[list[str], float]]:
    import os

    os.environ["DRIVEBENCH_CACHE"] = str(cache)
    with initialize_config_dir(config_dir=str(REPO / "drivebench" / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[*TEST_SIZE, "ckpt=none", f"paths.output_dir={tmp}", *overrides])
    run = build_run(cfg, tmp, progress=False)
    recorder = _Recorder()
    trainer = pl.Trainer(**run.trainer_kwargs(), max_steps=steps, logger=False, callbacks=[recorder],
                         enable_checkpointing=False, enable_progress_bar=False, limit_val_batches=0)
    trainer.fit(run.module, datamodule=run.datamodule)
    return recorder.steps


@pytest.fixture(scope="module")
def baseline(drivebench_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> list[tuple[list[str], float]]:
    torch.set_num_threads(1)
    return _train(drivebench_cache, tmp_path_factory.mktemp("base"), ["accel=none"])


@pytest.mark.parametrize(
    "knobs",
    [
        ["accel.num_workers=2"],
        ["accel.num_workers=2", "accel.persistent_workers=true", "accel.prefetch_factor=3"],
        ["accel.preprocess_workers=2"],
        ["accel.shm_cache=true"],
        # the thread count changes how reductions split their sums (settings.numerics_changed_by lists it):
        # these presets keep the baseline's one thread so that their other knobs are compared alone
        ["accel=cpu", "accel.threads=1"],
        ["accel=max", "accel.precision=32-true", "accel.threads=1"],  # every loader/scheduling knob of max, fp32
    ],
    ids=["workers", "workers+persistent+prefetch", "process-pool", "shm-cache", "cpu-preset", "max-loaders"],
)
def test_loader_and_scheduling_knobs_change_nothing(knobs, baseline, drivebench_cache: Path, tmp_path: Path):
    got = _train(drivebench_cache, tmp_path, ["accel=none", *knobs])
    assert [ids for ids, _ in got] == [ids for ids, _ in baseline], "sample order changed"
    assert [loss for _, loss in got] == [loss for _, loss in baseline], "losses changed"


def test_bf16_stays_within_tolerance(baseline, drivebench_cache: Path, tmp_path: Path):
    """bf16 autocast changes the arithmetic; on these first steps losses stay within 2% (relative)."""
    got = _train(drivebench_cache, tmp_path, ["accel=none", "accel.precision=bf16-mixed"])
    assert [ids for ids, _ in got] == [ids for ids, _ in baseline]
    for (_, a), (_, b) in zip(got, baseline):
        assert a == pytest.approx(b, rel=0.02)


# ---- bad input stops before any work, naming the key ---------------------------------------
@pytest.mark.parametrize(
    "overrides, message",
    [
        (["model=nosuchmodel"], "drivebench: error: model='nosuchmodel' is not valid; choose one of: gaussianformer, "
                                "maptr, mmdet3d, qcnet, sparsedrive"),
        (["model.size=huge"], "model.size='huge' is not a size of model 'qcnet'; valid choices: paper, test"),
        (["accel.num_workers=-1"], "accel.num_workers=-1 is not valid"),
        (["data.root=/nonexistent/av2"], "data.root=/nonexistent/av2 does not exist"),
        (["data.size=huge"], "data.size='huge' is not valid; choose one of"),
        (["model.batch_size=0"], "model.batch_size=0 is not valid"),
        (["bench.profile=-1"], "bench.profile=-1 is not valid"),
        (["ckpt=remote"], "ckpt=remote needs a destination: ckpt.dir="),
        (["model.batch_size=64"], "model.batch_size=64 x 1 rank(s) is more than the 32 samples of the training split"),
    ],
)
def test_bad_values_give_one_clear_line(overrides, message, drivebench_cache: Path, tmp_path: Path, in_process_cli,
                                       capsys):
    """The ``drivebench`` entry point called in this process (the command's path without a Python
    start-up per case, nine of them: seconds each on 2 cores); the subprocess form is the next test's."""
    from drivebench.__main__ import main

    in_process_cli(drivebench_cache, tmp_path)
    with pytest.raises(SystemExit) as stop:
        main([*TEST_SIZE, *overrides, f"hydra.run.dir={tmp_path}"])
    err = capsys.readouterr().err
    assert stop.value.code == 2, err[-2000:]
    assert message in err, err[-2000:]
    assert "Traceback" not in err
    assert not (tmp_path / "summary.json").exists()


def test_a_root_in_the_wrong_format_is_named(drivebench_cache: Path, tmp_path: Path):
    wrong = tmp_path / "not-av2"
    (wrong / "train").mkdir(parents=True)
    (wrong / "train" / "readme.txt").write_text("not a scenario")
    proc = run_cli([*TEST_SIZE, f"data.root={wrong}", f"hydra.run.dir={tmp_path / 'run'}"], drivebench_cache)
    assert proc.returncode == 2
    assert "does not look like Argoverse 2 motion forecasting" in proc.stderr
