"""A run's TensorBoard scalars as one long table: ``phase`` (train, validation, ceiling), ``tag``, ``step``.

Two layouts are read, to the same table:

* one event stream per run, the phase at the head of every tag (``drivebench.bench.phase_logger``):
  ``fit/perf/*``, ``fit/train/*``, ``fit/val/*`` (train phase), ``ceiling/perf/*`` and
  ``ceiling/train/*`` (ceiling), ``validate/val/*`` (the end-of-run validation, logged at the last
  training step). The phase is read from the tag and the tag is given back without it, the
  ceiling's step clock as ``ceiling/<name>``, as the older layout wrote it;
* one event file per Lightning Trainer (runs before the single stream, e.g. under
  ``experiments/results/``): the training phase (``perf/*``, ``train/*``, and ``val/*`` when
  validating during fit), the end-of-run validation (``val/*`` only, at step 0 of its own trainer)
  and the ceiling (``ceiling/*`` plus the ceiling's own ``train/*`` losses, which restart at step
  0). Such files are classified by their tags, so a training curve never mixes in the ceiling's steps.

A file is of the first layout when a tag starts with ``fit/``, ``validate/`` or ``ceiling/perf/``,
which the older layout never wrote. Either way the end-of-run validation is placed at the last
training step. Time runs from the start of training: the first step's end time minus its duration
(``perf/step_time_s``), so ``elapsed_s`` is wall time since the first step began.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

COLUMNS = ["phase", "tag", "step", "value", "wall_time", "elapsed_s", "file"]
TRAIN, VALIDATION, CEILING, OTHER = "train", "validation", "ceiling", "other"
# the phase prefix of a tag in the one-stream layout -> the report's phase name
STREAM_PHASES = {"fit": TRAIN, "validate": VALIDATION, "ceiling": CEILING}
CLOCK_GROUP = "perf/"  # the step timer's tags (drivebench.perf.callback.TAG_GROUP)


def file_phase(tags: list[str]) -> str:
    """The phase of an event file of the per-Trainer layout, from its tags."""
    if any(t.startswith("ceiling/") for t in tags):
        return CEILING
    if any(t.startswith("perf/") for t in tags):
        return TRAIN
    if any(t.startswith("val/") for t in tags):
        return VALIDATION
    return OTHER


def is_phase_stream(tags: list[str]) -> bool:
    """Whether the file is of the one-stream layout (every tag led by its phase)."""
    return any(t.startswith(("fit/", "validate/", f"ceiling/{CLOCK_GROUP}")) for t in tags)


def split_phase_tag(tag: str) -> tuple[str, str]:
    """``fit/perf/step_time_s`` -> (``train``, ``perf/step_time_s``); ``ceiling/perf/x`` -> (``ceiling``,
    ``ceiling/x``); a tag without a known phase prefix -> (``other``, the tag)."""
    head, _, rest = tag.partition("/")
    phase = STREAM_PHASES.get(head)
    if phase is None or not rest:
        return OTHER, tag
    if phase == CEILING and rest.startswith(CLOCK_GROUP):
        return CEILING, "ceiling/" + rest.removeprefix(CLOCK_GROUP)
    return phase, rest


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
    if is_phase_stream(tags):
        named = {tag: split_phase_tag(tag) for tag in tags}
    else:
        phase = file_phase(tags)
        named = {tag: (phase, tag) for tag in tags}
    rows = [(*named[tag], int(e.step), float(e.value), float(e.wall_time), str(path))
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
    perf_steps = train.loc[train["tag"].str.startswith("perf/"), "step"]
    last_step = int(perf_steps.max()) if not perf_steps.empty else 0
    data.loc[data["phase"] == VALIDATION, "step"] = last_step
    data["elapsed_s"] = data["wall_time"] - origin
    return data[COLUMNS].sort_values(["phase", "tag", "step", "wall_time"], ignore_index=True), errors
