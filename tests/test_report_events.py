"""The report reads a run's TensorBoard scalars the same way from both layouts: one event file per
Lightning Trainer (runs before the single stream, e.g. experiments/results/) and one stream per run
with the phase at the head of every tag (drivebench.bench.phase_logger). Events are written by
Lightning's own TensorBoardLogger, once as the runners used it before and once through PhaseLogger."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from lightning.pytorch.loggers import TensorBoardLogger

from drivebench.bench.phase_logger import CEILING, FIT, VALIDATE, PhaseLogger, phase_logger
from drivebench.report.events import read_scalars, split_phase_tag
from tests.conftest import REPO

TRAIN_STEPS, CEILING_STEPS = 4, 3


def _phases() -> list[tuple[str, list[tuple[int, dict[str, float]]]]]:
    """What one run logs, phase by phase, as (step, metrics) at the Lightning logger's interface."""
    fit = [(s, {"perf/step_time_s": 0.5 + s, "perf/data_wait_s": 0.1, "train/loss": 10.0 - s, "epoch": 0.0})
           for s in range(1, TRAIN_STEPS + 1)]
    validate = [(0, {"val/minFDE": 3.0, "val/loss": 7.5, "epoch": 0.0})]
    ceiling = [(s, {"perf/step_time_s": 0.25, "train/loss": 9.0 - s, "epoch": 0.0}) for s in range(1, CEILING_STEPS + 1)]
    return [(FIT, fit), (VALIDATE, validate), (CEILING, ceiling)]


def _old_tag(phase: str, tag: str) -> str:
    """The per-Trainer layout: the ceiling's step timer wrote ceiling/<name> (its own prefix)."""
    return "ceiling/" + tag.removeprefix("perf/") if phase == CEILING and tag.startswith("perf/") else tag


def write_per_trainer_layout(root: Path) -> list[Path]:
    """As before the single stream: the run's logger handed to each Trainer, which finalized it at its
    end, so each phase's first log opened a new event file."""
    logger = TensorBoardLogger(save_dir=str(root), name="tb", version="", default_hp_metric=False)
    for phase, logs in _phases():
        for step, metrics in logs:
            logger.log_metrics({_old_tag(phase, k): v for k, v in metrics.items()}, step=step)
        logger.finalize("success")
    return sorted((root / "tb").glob("events.out.tfevents.*"))


def write_phase_stream(root: Path) -> list[Path]:
    """As the runners log now: one logger, a PhaseLogger view per Trainer, finalized once at the end."""
    logger = TensorBoardLogger(save_dir=str(root), name="tb", version="", default_hp_metric=False)
    for phase, logs in _phases():
        view = PhaseLogger(logger, phase, step_offset=TRAIN_STEPS if phase == VALIDATE else 0)
        for step, metrics in logs:
            view.log_metrics(metrics, step=step)
        view.finalize("success")  # what each phase's Trainer does when it ends
    logger.finalize("success")
    return sorted((root / "tb").glob("events.out.tfevents.*"))


def _comparable(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[["phase", "tag", "step", "value"]].sort_values(["phase", "tag", "step"], ignore_index=True)


def test_both_layouts_read_to_the_same_table(tmp_path: Path):
    old_files = write_per_trainer_layout(tmp_path / "old")
    new_files = write_phase_stream(tmp_path / "new")
    assert len(old_files) == 3 and len(new_files) == 1
    old, old_errors = read_scalars(old_files)
    new, new_errors = read_scalars(new_files)
    assert not old_errors and not new_errors
    pd.testing.assert_frame_equal(_comparable(old), _comparable(new))
    # what the table says, in either layout
    ceiling_loss = new[(new["phase"] == "ceiling") & (new["tag"] == "train/loss")]
    assert sorted(ceiling_loss["step"]) == [1, 2, 3]  # the ceiling's losses never join the training curve
    train_loss = new[(new["phase"] == "train") & (new["tag"] == "train/loss")]
    assert sorted(train_loss["step"]) == [1, 2, 3, 4]
    assert set(new.loc[new["phase"] == "validation", "step"]) == {TRAIN_STEPS}
    assert "ceiling/step_time_s" in set(new.loc[new["phase"] == "ceiling", "tag"])
    first = new[(new["tag"] == "perf/step_time_s") & (new["step"] == 1)].iloc[0]
    # time runs from when the first step began: its end is its own duration after that
    assert first["elapsed_s"] == pytest.approx(first["value"], abs=0.05)


def test_the_stream_holds_the_phase_in_every_tag(tmp_path: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (events,) = write_phase_stream(tmp_path)
    acc = EventAccumulator(str(events))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert all(tag.split("/", 1)[0] in (FIT, VALIDATE, CEILING) for tag in tags), sorted(tags)
    assert {"fit/perf/step_time_s", "fit/train/loss", "ceiling/perf/step_time_s", "ceiling/train/loss",
            "validate/val/minFDE"} <= tags
    assert [e.step for e in acc.Scalars("validate/val/minFDE")] == [TRAIN_STEPS]  # at the weights' step


def test_tags_split_into_phase_and_the_older_name():
    assert split_phase_tag("fit/perf/step_time_s") == ("train", "perf/step_time_s")
    assert split_phase_tag("fit/val/minFDE") == ("train", "val/minFDE")  # validation during fit
    assert split_phase_tag("validate/val/minFDE") == ("validation", "val/minFDE")
    assert split_phase_tag("ceiling/perf/h2d_s") == ("ceiling", "ceiling/h2d_s")
    assert split_phase_tag("ceiling/train/loss") == ("ceiling", "train/loss")
    assert split_phase_tag("hp_metric") == ("other", "hp_metric")


def test_a_committed_run_of_the_per_trainer_layout_keeps_its_meaning():
    run = REPO / "experiments" / "results" / "h200-2026-11-30" / "qcnet_max"
    files = sorted((run / "tb").glob("events.out.tfevents.*"))
    assert len(files) == 3
    data, errors = read_scalars(files)
    assert not errors
    tags = {phase: set(part["tag"]) for phase, part in data.groupby("phase")}
    assert {"perf/step_time_s", "train/loss"} <= tags["train"]
    assert {"ceiling/step_time_s", "train/loss"} <= tags["ceiling"]
    assert "val/minFDE" in tags["validation"]
    last_train_step = data.loc[(data["phase"] == "train") & (data["tag"] == "perf/step_time_s"), "step"].max()
    assert set(data.loc[data["phase"] == "validation", "step"]) == {last_train_step}


def test_a_phase_view_needs_a_known_phase_and_a_logger():
    with pytest.raises(ValueError, match="phase must be one of"):
        PhaseLogger(TensorBoardLogger(save_dir="unused"), "warmup")
    assert phase_logger(False, FIT) is False and phase_logger(None, FIT) is False
