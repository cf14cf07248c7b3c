"""A run's TensorBoard scalars as one long table, with each event file's phase told apart.

A run writes one event file per Lightning Trainer: the training phase (``perf/*``, ``train/*``, and
``val/*`` when validating during fit), the end-of-run validation (``val/*`` only, at step 0 of its
own trainer) and the ceiling phase (``ceiling/*`` plus the ceiling's own ``train/*`` losses, which
restart at step 0). Files are classified by their tags so that a training curve never mixes in the
ceiling's steps, and the end-of-run validation is placed at the last training step.

Time runs from the start of training: the first measured-or-warm-up step's end time minus its
duration (``perf/step_time_s``), so ``elapsed_s`` is wall time since the first step began.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

COLUMNS = ["phase", "tag", "step", "value", "wall_time", "elapsed_s", "file"]
TRAIN, VALIDATION, CEILING, OTHER = "train", "validation", "ceiling", "other"


def file_phase(tags: list[str]) -> str:
    if any(t.startswith("ceiling/") for t in tags):
        return CEILING
    if any(t.startswith("perf/") for t in tags):
        return TRAIN
    if any(t.startswith("val/") for t in tags):
        return VALIDATION
    return OTHER


def _read_file(path: Path) -> pd.DataFrame:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(path), size_guidance={"scalars": 0, "tensors": 0, "histograms": 1, "images": 1,
                                                     "audio": 1, "compressedHistograms": 1})
    acc.Reload()
    try:
        acc.FirstEventTimestamp()
    except ValueError:  # the accumulator skips unreadable records silently: no event at all means garbage
        raise ValueError("no readable event in the file") from None
    tags = acc.Tags().get("scalars", [])
    phase = file_phase(tags)
    rows = [(phase, tag, int(e.step), float(e.value), float(e.wall_time), str(path))
            for tag in tags for e in acc.Scalars(tag)]
    return pd.DataFrame(rows, columns=["phase", "tag", "step", "value", "wall_time", "file"])


def _training_origin(train: pd.DataFrame) -> float:
    """Wall time at which the first training step began (see module docstring)."""
    steps = train[train["tag"] == "perf/step_time_s"].sort_values(["wall_time", "step"])
    if not steps.empty:
        first = steps.iloc[0]
        return float(first["wall_time"] - first["value"])
    return float(train["wall_time"].min()) if not train.empty else math.nan


def read_scalars(files: list[Path]) -> tuple[pd.DataFrame, list[str]]:
    """All scalars of one run's event files, and a message per file that could not be read."""
    frames, errors = [], []
    for path in files:
        try:
            frames.append(_read_file(path))
        except Exception as err:  # a truncated or foreign event file must not stop the report
            errors.append(f"{path}: TensorBoard events not readable ({type(err).__name__}: {err})")
    if not frames:
        return pd.DataFrame(columns=COLUMNS), errors
    data = pd.concat(frames, ignore_index=True)
    train = data[data["phase"] == TRAIN]
    origin = _training_origin(train)
    if math.isnan(origin):
        origin = float(data["wall_time"].min())
    # the end-of-run validation belongs at the last training step, not at its own trainer's step 0
    last_step = int(train.loc[train["tag"].str.startswith("perf/"), "step"].max()) if not train.empty else 0
    data.loc[data["phase"] == VALIDATION, "step"] = last_step
    data["elapsed_s"] = data["wall_time"] - origin
    return data[COLUMNS].sort_values(["phase", "tag", "step", "wall_time"], ignore_index=True), errors
