"""``accel=auto``: which knobs help on this machine and model, found by timing them.

The search is greedy, one knob (a *stage*) at a time, in the order of what usually pays most:
loader workers, prefetch, the device transform, CUDA graphs, activation checkpointing off,
precision and TF32 (only with ``accel.auto_numerics``), channels-last, cuDNN autotuning, pinned
memory, the fused optimizer; then compile, in the run (below). Each
stage times the values of its knob on top of the best setting so far (the *incumbent*) and keeps the
first value, in the stage's order of preference, whose median step time is within ``margin`` of
the fastest. The trial times eager steps and the run trains compiled ones, so a difference inside the
noise is settled by what ``max`` (the hand-tuned preset) uses on this machine: the compute knobs (CUDA
graphs, bf16 on GPUs, TF32, channels-last, cuDNN autotuning, the fused optimizer) list ``max``'s value
first. (H200, 2026-12-03: MapTR's trial timed TF32 and cuDNN autotuning 4.6% and 2.5% slower at its
167-185 ms eager steps; auto, then listing the simplest value first, trained without them at 145 ms per
compiled step, ``max`` with them at 127 ms in the session before.) Activation checkpointing keeps
upstream's recomputation first, as ``max`` does where the activations would not fit. The pipeline knobs
of the loader (pinned memory, the device transform) list the deeper pipeline first, and ``accel=auto``
starts from ``max``'s loader pipeline: a loader that merely keeps up at the trial's eager steps falls
behind in the run (H200, 2026-12-02: auto chose PyTorch's prefetch and unpinned batches at QCNet's
140 ms eager step, then waited for data 14% of its 67 ms compiled step, against 1% for ``max``). A count (workers,
prefetch) is tried from its largest value down: when the largest is no faster than the incumbent,
nothing in between is tried; going down stops at the first value slower than the stage's best; a
largest value within ``2 x margin`` of the incumbent's count is not tried at all (15 against 16
workers cannot save the margin). A stage the machine or model does not
allow is listed with the reason; a stage the incumbent's own figures rule out (the loader already
keeps up, the copy to the device takes under ``margin`` of a step) is skipped with the numbers. A
candidate whose first measured steps are already far slower than the incumbent
(``SLOWER_STOP`` x margin) stops there: its trial says all it needs to.

Compile is not a trial stage but the last decision, made on the run's own steps
(``drivebench.accel.compile_judge``): a cold compile takes minutes (QCNet on an H200: 130-190 s),
which no trial budget of a bounded run covers and which, tried in the trial and then again in the
run, would be paid twice. The run starts compiled (with CUDA graphs where the model allows them) on
top of the trial's eager choice, and goes back to that choice when its compiled steps are not faster
than the incumbent's trial median by the margin.

Candidates are accel overrides, applied through the same resolution as the presets
(``AccelSettings.resolve``); this module only plans and decides. Measuring one candidate (a real
short training) is the caller's ``measure`` function (``drivebench.bench.autotune``). A candidate
whose trial raised is recorded with its error and never chosen; one cut short by the budget is never
chosen either. The budget bounds the whole search's cost: no trial starts when less than half a trial's
typical cost is left, and a running one is stopped at the budget. A short fit costs its wall time; a segment
of the run's own steps (``drivebench.accel.in_run_trial``) costs only what it takes beyond the same steps at
the best setting so far, since those steps train the run (SparseDrive on an H200, b39: charged by wall time,
two 15-step segments of ~1 s steps spent 47 s of the 60-s budget while costing 5.3 s, and bf16, the knob that
pays most, was never tried: auto trained at 0.63x ``max``).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Generator, Mapping, Sequence

OK, FAILED, CUT, SKIPPED, IN_RUN = "ok", "failed", "cut", "skipped", "in run"
SLOWER_STOP = 5.0  # a candidate stops early once its median is over (1 + SLOWER_STOP * margin) x the incumbent's
SLOWER_AFTER = 3   # measured steps before that check
LOADER_BOUND, H2D_BOUND = "data_wait", "h2d"


@dataclass(frozen=True)
class Capabilities:
    """What this machine and model allow (from the base candidate's own run)."""

    on_gpu: bool
    cpu_cores: int
    cores_per_device: int
    bf16: bool
    device_transform: bool          # the model's transform can run on the device (camera models)
    compile_units: int              # units ``accel.compile`` would compile (0: the model declares none)
    cuda_graphs: str                # "" where CUDA graphs can run, else why not
    convolutions: bool              # the net has Conv2d layers (channels-last, cuDNN autotuning)
    worker_cap: int = 16            # most loader workers tried
    checkpointed: bool = False      # the model's backbones recompute activations by default (upstream's with_cp)
    checkpointing_live: str = "not measured"  # "" where checkpointing off may be timed on the run's own steps, else why not
    fused_optimizer: str = ""        # "" where a fused optimizer can run, else why not (clipping under mixed precision)


@dataclass(frozen=True)
class Stage:
    """One knob and its values in order of preference: the first value within the margin of the fastest wins."""

    knob: str
    values: tuple[Any, ...]
    bound_by: str | None = None     # skip when the incumbent shows this share of the step below the margin
    ordered: bool = False           # a count (workers, prefetch): the largest first, then down while it pays
    in_run: bool = False            # decided on the run's own steps, not timed in the trial (compile)
    live: bool = False              # switchable between two steps of one fit (timed on the run's own steps)


@dataclass
class Measurement:
    """What one trial measured (``drivebench.bench.autotune`` fills it from the step timer)."""

    steps_measured: int = 0
    steps_wanted: int = 0
    step_s: dict[str, float] = field(default_factory=dict)  # describe(): median, p10, p90, ...
    data_wait_fraction: float = math.nan
    h2d_fraction: float = math.nan
    samples_per_s: float = math.nan
    error: str | None = None
    cost_s: float = 0.0
    cost_split: dict[str, float] = field(default_factory=dict)  # where cost_s went: build, start, steps, teardown
    warmup_steps_s: list[list[float]] = field(default_factory=list)  # [step, its data wait] of each warm-up step
    stopped_slower: bool = False    # stopped after SLOWER_AFTER steps: already far slower than the incumbent

    @property
    def median(self) -> float:
        return float(self.step_s.get("median", math.nan))


@dataclass
class Trial:
    """One row of the trial table (``summary.json`` ``autotune.trials``)."""

    stage: str
    change: str                     # what this candidate changes on the incumbent ("base" for the first)
    setting: dict[str, Any]         # the candidate's accel overrides on the preset
    status: str = OK
    step_s_median: float | None = None
    step_s_p10: float | None = None
    step_s_p90: float | None = None
    samples_per_s: float | None = None
    data_wait_fraction: float | None = None
    h2d_fraction: float | None = None
    steps_measured: int = 0
    cost_s: float = 0.0
    cost_split: dict[str, float] | None = None  # build / start / steps / teardown seconds of cost_s
    warmup_steps_s: list[list[float]] | None = None  # [step s, data wait s] per warm-up step: what a start costs
    reason: str | None = None       # why it failed, was cut or skipped
    chosen: bool = False            # the setting the run then trains with (one row)
    where: str = "trial"            # "trial": a short training of its own; "run": segments of the run's own steps

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _finite(value: float) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def worker_counts(cap: int) -> tuple[int, ...]:
    """0, then powers of two up to ``cap``, and ``cap`` itself."""
    counts = [0]
    n = 1
    while n < cap:
        counts.append(n)
        n *= 2
    if cap > 0:
        counts.append(cap)
    return tuple(dict.fromkeys(counts))


CUDNN_PLAN_CACHE = ("cuDNN keeps the plan a convolution first ran with, whatever the flag: a switch inside one "
                    "process cannot be timed; the run keeps accel.cudnn_benchmark (max's value on GPUs), autotuning "
                    "in the trial only the segment whose convolutions run as the run's will")


def plan_stages(caps: Capabilities, auto_numerics: bool) -> tuple[list[Stage], list[dict[str, str]]]:
    """The stages this machine and model allow, in search order, and the others with the reason."""
    planned: list[Stage] = []
    not_allowed: list[dict[str, str]] = []

    def stage(knob: str, values: tuple[Any, ...], why_not: str = "", **kw: Any) -> None:
        if why_not:
            not_allowed.append({"stage": knob, "reason": why_not})
        else:
            planned.append(Stage(knob, values, **kw))

    no_gpu = "" if caps.on_gpu else "no CUDA device on this machine"
    stage("num_workers", worker_counts(caps.worker_cap), bound_by=LOADER_BOUND, ordered=True)
    stage("prefetch_factor", (None, 4, 8), bound_by=LOADER_BOUND, ordered=True)
    # the loader's pipeline knobs: the deeper pipeline first (the run's compiled steps outpace the trial's)
    stage("device_transform", ("decode", "images", "off"),
          no_gpu or ("" if caps.device_transform else "the model has no device-side transform"),
          bound_by=LOADER_BOUND)
    # compute knobs: max's value on this machine first (what the trial's eager steps cannot judge for the
    # compiled run, a tie keeps); activation checkpointing: upstream's (keep) first, as max keeps it unless it fits
    stage("cuda_graphs", ("on", "off"), no_gpu or caps.cuda_graphs, live=True)
    # live only where dropping the recomputation is known to fit (activation_checkpointing=auto's rule): an
    # out-of-memory step on the run's own steps would end the run, in a short fit it only fails its row
    stage("activation_checkpointing", ("keep", "off"),
          "" if caps.checkpointed else "the model does not checkpoint activations", live=not caps.checkpointing_live)
    numerics = "" if auto_numerics else "accel.auto_numerics=false (the number format stays fp32)"
    bf16 = "" if (caps.bf16 or not caps.on_gpu) else "the GPU has no bf16"
    stage("precision", ("bf16-mixed", "32-true") if caps.on_gpu else ("32-true", "bf16-mixed"), numerics or bf16,
          live=True)
    stage("tf32", (True, False), numerics or no_gpu, live=True)
    convs = "" if caps.convolutions else "the model has no convolutions"
    stage("channels_last", (True, False), no_gpu or convs, live=True)
    # not timed: PyTorch keeps one cuDNN plan per convolution (shapes, strides, dtype, TF32, determinism, not the
    # flag), chosen when a shape first runs, so switching autotuning in a running process changes nothing for the
    # shapes already run (b41: GaussianFormer's trial timed it on plans its base had picked by heuristics, and
    # its compiled run reused them, 3.5-5% slower per step than max). The run starts with max's value; the
    # segments autotune only the key set the run trains with (drivebench.accel.in_run_trial.runs_final_conv_keys).
    not_allowed.append({"stage": "cudnn_benchmark", "reason": no_gpu or convs or CUDNN_PLAN_CACHE})
    stage("pin_memory", (True, False), no_gpu, bound_by=H2D_BOUND)
    stage("fused_optimizer", (True, False), no_gpu or caps.fused_optimizer, live=True)
    compile_why = ("inductor's CPU compile takes minutes (accel.compile auto = GPUs only)" if not caps.on_gpu
                   else "" if caps.compile_units else "the model declares no compile units")
    stage("compile", (False, True), compile_why, in_run=True)
    return planned, not_allowed


def _label(knob: str, value: Any) -> str:
    return f"{knob}={'null' if value is None else value}"


def _trial_order(stage: Stage, current: Any) -> list[Any]:
    """The order values are tried in: as listed; a count from its largest value downwards (one trial
    tells whether more of it pays at all, and going down finds the smallest that is as fast)."""
    if not stage.ordered:
        return list(stage.values)
    return [v for v in reversed(stage.values) if v != current]


def _preference_order(stage: Stage, current: Any) -> list[Any]:
    """The stage's values and the incumbent's in order of preference: as listed, and a count in size order
    (an incumbent's count between the listed ones, 15 workers from ``num_workers: auto``, in its place)."""
    if current in stage.values:
        return list(stage.values)
    if stage.ordered:
        return sorted((*stage.values, current), key=lambda v: (v is not None, v or 0))
    return [*stage.values, current]


def _close_count(stage: Stage, current: Any, margin: float) -> bool:
    """Whether a count stage's largest value is so close above the incumbent's count (16 workers against
    ``num_workers: auto``'s 15) that it cannot save the margin: the stage would only pay for a trial."""
    top = stage.values[-1]  # counts are ints or None (PyTorch's default prefetch)
    return (stage.ordered and isinstance(current, int) and isinstance(top, int)
            and 0 < current < top <= current * (1.0 + 2.0 * margin))


def _also(reason: str | None, more: str) -> str:
    return f"{reason}; {more}" if reason else more


def _stop_descending(stage: Stage, trial: Trial, in_stage: dict[Any, Trial], current: Any, margin: float) -> bool:
    """Whether a count stage can stop after ``trial`` (smaller values would only be slower); says why."""
    done = [t for t in in_stage.values() if t.status == OK and t.step_s_median is not None]
    best = min(t.step_s_median for t in done)
    value = trial.setting.get(stage.knob)
    if value == stage.values[-1] and in_stage[current].status == OK and (
            in_stage[current].step_s_median <= trial.step_s_median * (1.0 + margin)):
        trial.reason = _also(trial.reason, f"no faster than {_label(stage.knob, current)}: a count in between is not tried")
        return True
    if trial.step_s_median > best * (1.0 + margin):
        trial.reason = _also(trial.reason, "slower than the best of this stage: smaller values not tried")
        return True
    return False


def choose(trials: Sequence[Trial], margin: float) -> Trial | None:
    """The first trial (in the given order) within ``margin`` of the fastest completed one."""
    done = [t for t in trials if t.status == OK and t.step_s_median is not None]
    if not done:
        return None
    best = min(t.step_s_median for t in done)
    return next(t for t in done if t.step_s_median <= best * (1.0 + margin))


@dataclass
class SearchResult:
    chosen: dict[str, Any]          # accel overrides of the winner (on the preset)
    trials: list[Trial]
    not_allowed: list[dict[str, str]]
    cost_s: float
    stopped_by_budget: bool
    in_run: list[str] = field(default_factory=list)  # knobs left to the run's own steps (compile)

    def changes(self, base: Mapping[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in self.chosen.items() if base.get(k) != v}


def error_text(err: BaseException) -> str:
    """A failed candidate's row text (a short fit's or a segment's): ``Type: first line``, and the last line
    when it says more (a loader worker's original error)."""
    lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
    text = lines[0][:200] if lines else ""
    if len(lines) > 1 and lines[-1] != lines[0]:
        text += f" ... {lines[-1][:200]}"
    return f"{type(err).__name__}: {text}".rstrip(": ")


@dataclass(frozen=True)
class Request:
    """What the search asks to be measured next: ``setting`` (accel overrides), with ``seconds_left`` of the
    budget, stopped after ``SLOWER_AFTER`` measured steps once their median is over ``stop_above_s``;
    ``reference_s`` is the incumbent's median (None for the base), what a segment's cost is counted against;
    ``stage``, the knob whose candidate this is ("base" for the first)."""

    setting: dict[str, Any]
    seconds_left: float
    stop_above_s: float | None
    reference_s: float | None = None
    stage: str = "base"


def search(base: Mapping[str, Any], stages: Sequence[Stage],
           measure: Callable[[dict[str, Any], float, float | None], Measurement],
           budget_s: float, margin: float, not_allowed: Sequence[dict[str, str]] = (),
           clock: Callable[[], float] = time.monotonic) -> SearchResult:
    """Greedy search from ``base`` (the preset's knob values) over ``stages``.

    ``measure(setting, seconds_left, stop_above_s)`` trains a few steps with the accel overrides
    ``setting``, stops at ``seconds_left``, and after ``SLOWER_AFTER`` measured steps stops when their
    median is over ``stop_above_s`` (None: never); it returns a :class:`Measurement` (``error`` set
    when it raised). Stages marked ``in_run`` are not measured: they get an ``in run`` row.
    """
    steps = search_steps(base, stages, budget_s, margin, not_allowed, clock)
    try:
        request = next(steps)
        while True:
            request = steps.send(measure(dict(request.setting), request.seconds_left, request.stop_above_s))
    except StopIteration as done:
        return done.value


def search_steps(base: Mapping[str, Any], stages: Sequence[Stage], budget_s: float, margin: float,
                 not_allowed: Sequence[dict[str, str]] = (), clock: Callable[[], float] = time.monotonic,
                 where: str = "trial", charge: str = "wall") -> Generator[Request, Measurement, SearchResult]:
    """:func:`search` as a generator: it yields each :class:`Request` and is sent its :class:`Measurement`,
    so a caller that cannot call back (the run's own training loop, ``drivebench.accel.in_run_trial``)
    can drive it one step boundary at a time. Its rows carry ``where``.

    ``charge`` says what the budget counts: ``"wall"``, the time since the search began (short fits, all of
    whose time is the trial's); ``"cost"``, the measurements' own ``cost_s`` (segments of the run's steps,
    which report only their time beyond the same steps at the reference). Under ``"cost"`` the base is always
    measured: it is the reference, and its steps train the run."""
    if charge not in ("wall", "cost"):
        raise ValueError(f"charge={charge!r}: use 'wall' or 'cost'")
    start = clock()
    trials: list[Trial] = []
    stopped = False

    def left() -> float:
        if charge == "cost":
            return budget_s - sum(max(t.cost_s, 0.0) for t in trials)
        return budget_s - (clock() - start)

    def run_trial(stage: str, change: str, setting: dict[str, Any]) -> Generator[Request, Measurement, Trial]:
        nonlocal stopped
        trial = Trial(stage=stage, change=change, setting=dict(setting), where=where)
        costs = [t.cost_s for t in trials if t.status in (OK, FAILED, CUT) and t.cost_s > 0]
        typical = sorted(costs)[len(costs) // 2] if costs else 0.0
        remaining = left()
        exempt = charge == "cost" and not trials  # the base: the reference, and steps the run trains anyway
        if not exempt and (remaining <= 0 or (typical and remaining < 0.5 * typical)):
            stopped = True
            trial.status, trial.reason = SKIPPED, (f"budget: {max(remaining, 0):.1f} s of accel.auto_budget_s="
                                                   f"{budget_s:g} left, a trial costs ~{typical:.1f} s")
            trials.append(trial)
            return trial
        reference = next((t.step_s_median for t in trials if t.chosen), None)  # the incumbent's
        stop_above = reference * (1.0 + SLOWER_STOP * margin) if reference else None
        m = yield Request(dict(setting), max(remaining, 0.0), stop_above, reference, stage)
        trial.cost_s = m.cost_s
        trial.cost_split = dict(m.cost_split) or None
        trial.warmup_steps_s = [list(pair) for pair in m.warmup_steps_s] or None
        trial.steps_measured = m.steps_measured
        trial.step_s_median, trial.step_s_p10 = _finite(m.median), _finite(m.step_s.get("p10", math.nan))
        trial.step_s_p90 = _finite(m.step_s.get("p90", math.nan))
        trial.samples_per_s = _finite(m.samples_per_s)
        trial.data_wait_fraction, trial.h2d_fraction = _finite(m.data_wait_fraction), _finite(m.h2d_fraction)
        if m.error is not None:
            trial.status, trial.reason = FAILED, m.error
        elif m.stopped_slower and trial.step_s_median is not None:
            trial.reason = (f"stopped after {m.steps_measured} of {m.steps_wanted} measured steps: over "
                            f"{1.0 + SLOWER_STOP * margin:.2f}x the incumbent's median")
        elif m.steps_measured < m.steps_wanted or trial.step_s_median is None:
            stopped = True
            trial.status = CUT
            trial.reason = (f"stopped at the budget after {m.steps_measured} of {m.steps_wanted} measured steps")
        trials.append(trial)
        return trial

    incumbent = yield from run_trial("base", "base", dict(base))
    incumbent.chosen = True
    for stage in stages:
        current = incumbent.setting.get(stage.knob, base.get(stage.knob))
        if incumbent.status != OK:
            break  # nothing to compare against: the preset's own trial failed or was cut
        if stage.in_run:
            continue  # after the search, on the run's own steps (rows below)
        if stage.bound_by is not None:
            share = incumbent.data_wait_fraction if stage.bound_by == LOADER_BOUND else incumbent.h2d_fraction
            if share is not None and share < margin:
                what = "waiting for data" if stage.bound_by == LOADER_BOUND else "copying to the device"
                trials.append(Trial(stage=stage.knob, change=f"{stage.knob}: not tried", setting=dict(incumbent.setting),
                                    status=SKIPPED, reason=f"{what} takes {share:.1%} of the step, under the "
                                    f"margin {margin:.0%}: this knob cannot save more"))
                continue
        if stage.knob == "prefetch_factor" and not incumbent.setting.get("num_workers", base.get("num_workers")):
            trials.append(Trial(stage=stage.knob, change=f"{stage.knob}: not tried", setting=dict(incumbent.setting),
                                status=SKIPPED, reason="no loader workers: nothing prefetches"))
            continue
        if _close_count(stage, current, margin):
            top = stage.values[-1]
            trials.append(Trial(stage=stage.knob, change=_label(stage.knob, top), setting={**incumbent.setting, stage.knob: top},
                                status=SKIPPED, reason=f"within {2 * margin:.0%} of the incumbent's {current}: it cannot "
                                f"save the margin {margin:.0%}; smaller counts are tried only below a faster larger one"))
            continue
        in_stage: dict[Any, Trial] = {current: incumbent}
        for value in _trial_order(stage, current):
            if value in in_stage:
                continue
            trial = yield from run_trial(stage.knob, _label(stage.knob, value), {**incumbent.setting, stage.knob: value})
            in_stage[value] = trial
            if trial.status == SKIPPED:
                break
            if stage.ordered and trial.status == OK and _stop_descending(stage, trial, in_stage, current, margin):
                break
        ordered = [in_stage[v] for v in _preference_order(stage, current) if v in in_stage]
        winner = choose(ordered, margin)
        if winner is not None and winner is not incumbent:
            incumbent.chosen = False
            winner.chosen = True
            incumbent = winner
        if stopped:
            break
    if stopped:  # the stages never reached, named, so the table says what the budget left out
        reached = {t.stage for t in trials}
        for stage in stages:
            if stage.knob not in reached and not stage.in_run:
                trials.append(Trial(stage=stage.knob, change=f"{stage.knob}: not tried", setting=dict(incumbent.setting),
                                    status=SKIPPED, reason=f"budget: accel.auto_budget_s={budget_s:g} spent", where=where))
    # the preset's own trial failed or was cut (a loaded machine, a tiny budget): the run trains with the
    # preset, and no row is marked chosen, since a cut trial is never chosen
    incumbent.chosen = incumbent.status == OK
    chosen = incumbent.setting if incumbent.status == OK else dict(base)
    in_run = [stage.knob for stage in stages if stage.in_run] if incumbent.status == OK else []
    for knob in in_run:  # no trial budget: the run starts with it and keeps it only if its steps are faster
        value = next(stage.values[-1] for stage in stages if stage.knob == knob)
        trials.append(Trial(stage=knob, change=_label(knob, value), setting={**chosen, knob: value}, status=IN_RUN,
                            reason="judged on the run's own first steps against the chosen row (a cold compile "
                                   "takes minutes: tried here, the run would pay it again)"))
    for trial in trials:  # the rows not measured say where they would have been; compile's is the run's
        trial.where = "run" if trial.status == IN_RUN else where
    return SearchResult(chosen=chosen, trials=trials, not_allowed=list(not_allowed), cost_s=clock() - start,
                        stopped_by_budget=stopped, in_run=in_run if incumbent.status == OK else [])
