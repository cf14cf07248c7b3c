"""``accel=auto``'s live stages, timed on the run's own first steps.

Why: a candidate trained as a short fit of its own pays a build, a Trainer start, warm-up steps and a
teardown before and after a few measured steps (MapTR on an H200: ~7.6 s a candidate, five of them 26% of
a bounded run). The knobs that can change between two steps of one fit (CUDA graphs, precision, TF32,
channels-last, the fused optimizer, activation checkpointing where dropping it is known to
fit in memory) need none of that: each of their candidates is a *segment* of the run's own first steps,
``accel.auto_warmup_steps`` after the switch and ``accel.auto_steps`` measured, with the same greedy search
and margin (``drivebench.accel.autotune.search_steps``, driven one step boundary at a time). Those steps
train the run, so the trial costs what its segments took beyond the same steps at the setting finally
chosen (a slower candidate's extra time, a capture, an autotuning), not the steps themselves, and
``accel.auto_budget_s`` is charged the same way (``search_steps(charge="cost")``; charged by wall time,
SparseDrive's 1-s steps spent the budget on two segments: H200, b39). The step timer counts every trial step
as warm-up, so the run's statistics hold only steps at the chosen setting.

Then compile, as before (``drivebench.accel.compile_judge``): the run was built compiled, its compiled
calls set aside during the segments; they come back (with CUDA graphs where the model allows them) and
:class:`~drivebench.accel.compile_judge.CompileJudge` keeps or undoes them on the next measured steps.

What cannot switch inside a fit (the loader's knobs; activation checkpointing where its activations might not
fit: an out-of-memory step would end the run) is tried before the run in short fits
(``drivebench.bench.autotune``). The loader's knobs matter only when the loader bounds the step: so when
nothing else needs a short fit, the run starts at once, and if its first segment waits for data (or for
the copy to the device) for at least the margin of a step, it stops there with :class:`RetuneBeforeRun`
and starts again after trials of those knobs.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any, Callable, Generator, Sequence

import lightning.pytorch as pl
import torch
from torch import nn

from drivebench.accel.autotune import (CUT, IN_RUN, LOADER_BOUND, OK, SKIPPED, SLOWER_AFTER, Measurement, Request,
                                       SearchResult, Stage, error_text, search_steps)
from drivebench.accel.compile import to_channels_last
from drivebench.accel.compile_judge import CompileJudge
from drivebench.accel.settings import set_cudnn_benchmark, set_tf32
from drivebench.perf.callback import PhaseTimes, StepRecord, StepTimer
from drivebench.perf.summary import phase_stats

# what a captured graph bakes in (checkpointing: whether backward recomputes the backbone's forward)
GRAPHED_KERNEL_KNOBS = ("activation_checkpointing", "precision", "tf32", "channels_last")
SETTINGS_KNOBS = (*GRAPHED_KERNEL_KNOBS, "fused_optimizer")  # held as plain values in AccelSettings
LIVE_KNOBS = ("cuda_graphs", *SETTINGS_KNOBS)
ALL_WARMUP = 1 << 62  # the step timer's warm-up while the segments run: none of their steps is measured
# the live knobs in the key of PyTorch's cuDNN plan cache (dtype, TF32, strides): a new value, new plans
CONV_KEY_KNOBS = ("precision", "tf32", "channels_last")


def runs_final_conv_keys(setting: dict[str, Any], stage: str, stages: Sequence[Stage]) -> bool:
    """Whether a segment (the candidate of ``stage``, or "base") runs its convolutions with the keys the run will
    train with should every convolution-key stage after it keep its first value (max's on this machine).

    Why: cuDNN autotunes each new key once, at its first step (GaussianFormer on an H200: 15 s for bf16, 6 s
    for TF32, 15 s for channels-last, b42), and keeps that plan whatever the flag later says. Autotuning every
    segment cost 13% of a bounded run; only the key set the run trains with needs it, as ``max`` pays it too.
    """
    knobs = [s.knob for s in stages]
    later = stages[knobs.index(stage) + 1:] if stage in knobs else stages
    return all(setting.get(s.knob) == s.values[0] for s in later if s.knob in CONV_KEY_KNOBS)


def _conv_key(setting: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(setting.get(k) for k in CONV_KEY_KNOBS)


def close_trial_memory(device: torch.device) -> dict[str, float]:
    """The segments' peak device memory; then the caching allocator emptied and its peak counters restarted, so
    the run's ``memory.peak_device_gb`` is the chosen setting's, not that of a candidate it dropped (an fp32 or
    uncheckpointed segment: SparseDrive on an H200, 54 GiB against ``max``'s 30, b38). Nothing on a CPU."""
    if device.type != "cuda":
        return {}
    peak = {"peak_device_gb": torch.cuda.max_memory_allocated(device) / 2**30,
            "peak_device_reserved_gb": torch.cuda.max_memory_reserved(device) / 2**30}
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    return peak


class RetuneBeforeRun(RuntimeError):
    """The run's first segment showed the loader (or the copy to the device) bounding the step: its knobs
    need short fits of their own, so the run stops here and starts again after them (``app.main``)."""

    def __init__(self, reason: str, spent_s: float, steps: int, log_dir: str | None) -> None:
        super().__init__(reason)
        self.reason, self.spent_s, self.steps, self.log_dir = reason, spent_s, steps, log_dir


def precision_plugin(value: str, device_type: str) -> Any:
    """Lightning's precision plugin for ``accel.precision=value`` (what ``Trainer(precision=...)`` builds)."""
    from lightning.pytorch.plugins.precision import MixedPrecision, Precision

    if value == "32-true":
        return Precision()
    if value in ("bf16-mixed", "16-mixed"):
        return MixedPrecision(value, device_type)
    raise ValueError(f"accel.precision={value!r} cannot be switched inside a fit")


def switch(knob: str, value: Any, trainer: pl.Trainer, module: pl.LightningModule) -> None:
    """Set one live knob between two steps of a running fit."""
    if knob == "tf32":
        set_tf32(bool(value))
    elif knob == "channels_last":
        to_channels_last(getattr(module, "net", module), on=bool(value))
        _optimizer_state_like_params(trainer)
    elif knob == "precision":
        trainer.strategy.precision_plugin = precision_plugin(str(value), module.device.type)
    elif knob == "cuda_graphs":
        if value == "on" and getattr(module, "graphed_loss", None) is None:
            module.enable_cuda_graphs()  # captures at its next step, one graph per padded shape
        elif value != "on":
            module.disable_cuda_graphs()
    elif knob == "activation_checkpointing":
        set_checkpointing(getattr(module, "net", module), str(value))
    elif knob == "fused_optimizer":
        set_fused_optimizer(trainer, bool(value))
        module.fused_optimizer = bool(value)  # what a later fit's configure_optimizers builds (the ceiling)
    else:
        raise ValueError(f"accel.{knob} cannot be switched inside a fit (live knobs: {', '.join(LIVE_KNOBS)})")


def set_checkpointing(net: nn.Module, value: str) -> None:
    """``accel.activation_checkpointing`` between two steps: the backbones read their switch at every forward.
    The stage exists only where the model checkpoints by default, so ``keep`` is on."""
    from drivebench.models.common.checkpointing import set_activation_checkpointing

    if value not in ("keep", "off"):
        raise ValueError(f"accel.activation_checkpointing={value!r} cannot be switched inside a fit (keep, off)")
    set_activation_checkpointing(net, value == "keep")


def set_fused_optimizer(trainer: pl.Trainer, on: bool) -> None:
    """``accel.fused_optimizer`` between two steps: torch's Adam/AdamW read ``fused`` from each parameter group
    at every step, and keep each parameter's step count on its device for the fused kernel (on the host for
    the multi-tensor one), so the flag and the counts move together. Optimizers without a fused kernel are
    left alone."""
    for optimizer in trainer.optimizers:
        if "fused" not in optimizer.defaults:
            continue
        optimizer.defaults["fused"] = True if on else None  # None: torch picks foreach, as when built without it
        for group in optimizer.param_groups:
            group["fused"] = optimizer.defaults["fused"]
            if on:
                group["foreach"] = None  # fused and foreach are exclusive
            for param in group["params"]:
                step = optimizer.state.get(param, {}).get("step")
                if isinstance(step, torch.Tensor) and not group.get("capturable"):
                    optimizer.state[param]["step"] = step.to(param.device if on else "cpu", torch.float32)
        optimizer._step_supports_amp_scaling = on  # what torch sets for a fused optimizer (GradScaler's path)


def _optimizer_state_like_params(trainer: pl.Trainer) -> None:
    """The optimizers' per-parameter state (Adam's moments) in its parameter's strides again: the multi-tensor
    (foreach) kernels take their fast path only where a parameter and its state share strides, and fall back to
    one kernel per tensor otherwise (MapTR on the H200: compiled steps ~155 ms against ~130 ms for ``max``,
    whose weights were channels-last before the optimizer made its state)."""
    for optimizer in trainer.optimizers:
        for param, state in optimizer.state.items():
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and value.shape == param.shape and value.stride() != param.stride():
                    state[key] = torch.empty_like(param, dtype=value.dtype).copy_(value)


class CandidateGuard:
    """A candidate's failing step costs its row, not the run: while installed, an exception in the module's
    ``training_step`` or ``backward`` is recorded (``failure``) and the step trains nothing (``training_step``
    returns None, which Lightning skips; after a failed ``backward`` the gradients are dropped, so the optimizer
    step changes nothing). The trial then fails that row and goes back to the incumbent, as a short fit's failed
    row does (the 2026-12-05 CPU case: GaussianFormer's deformable convolution has no bf16 CPU kernel, and the
    precision segment ended the run). Only where ``may_fail()`` says the step runs a candidate; never under
    DDP, where a rank that skips its backward would stall the others' gradient all-reduce."""

    HOOKS = ("training_step", "backward")

    def __init__(self, may_fail: Callable[[], bool]) -> None:
        self.may_fail = may_fail
        self.failure: str | None = None
        self._module: pl.LightningModule | None = None

    def install(self, module: pl.LightningModule) -> None:
        self._module = module
        step, backward = module.training_step, module.backward

        def guarded_step(*args: Any, **kwargs: Any) -> Any:
            try:
                return step(*args, **kwargs)
            except Exception as err:
                self._catch(err)
                return None

        def guarded_backward(*args: Any, **kwargs: Any) -> None:
            try:
                backward(*args, **kwargs)
            except Exception as err:
                self._catch(err)
                for param in module.parameters():
                    param.grad = None

        module.training_step, module.backward = guarded_step, guarded_backward  # instance attributes: Lightning's
        # hook calls look them up on the module

    def remove(self) -> None:
        module, self._module = self._module, None
        for name in self.HOOKS:
            if module is not None and name in vars(module):
                delattr(module, name)  # the class's own methods again

    def _catch(self, err: Exception) -> None:
        if not self.may_fail():
            raise err
        self.failure = error_text(err)


@dataclasses.dataclass
class _Segment:
    request: Request
    records: list[StepRecord] = dataclasses.field(default_factory=list)


def _better(own: float | None, reference: float | None) -> float | None:
    """The faster of two medians, either of which may be missing (or NaN)."""
    known = [m for m in (own, reference) if m is not None and m == m]
    return min(known) if known else None


class InRunTrial(pl.Callback):
    """Time the live stages on the run's first steps, then hand compile to a :class:`CompileJudge`.

    Args:
        timer: the run's step timer (placed before this callback: its record of a step exists when this
            callback sees the step end).
        stages: the live stages and the ``in_run`` compile stage (``plan_stages``), in search order.
        start: the setting the segments start from (the short fits' choice, or the preset's values).
        built: the live knobs' values the run was built with (what is in effect at its first step).
        record: the summary's ``autotune`` block, completed in place.
        units: the compiled modules (``compile_units``): their compiled calls wait until the segments end.
        compile_setting: what the run starts compiled with ({"compile": True, "cuda_graphs": "on"}).
        gated: the stages left to short fits if the loader bounds the step (knob -> what bounds it).
        on_chosen: told the live knobs' chosen values (the run's settings for the phases after training).
    """

    def __init__(self, timer: StepTimer, stages: Sequence[Stage], start: dict[str, Any], built: dict[str, Any],
                 record: dict[str, Any], *, margin: float, steps: int, warmup: int, budget_s: float,
                 units: dict[str, nn.Module], compile_setting: dict[str, Any], gated: dict[str, str] | None = None,
                 on_chosen: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.timer, self.stages, self.start, self.record = timer, list(stages), dict(start), record
        self.current = {k: v for k, v in built.items() if k in LIVE_KNOBS}
        self.margin, self.steps, self.warmup, self.budget_s = float(margin), max(int(steps), 1), max(int(warmup), 0), budget_s
        self.units, self.compile_setting, self.gated = units, dict(compile_setting), dict(gated or {})
        self.on_chosen = on_chosen
        self.phase = "waiting"  # -> segments -> judging | done
        self._search: Generator[Request, Measurement, SearchResult] | None = None
        self._segment: _Segment | None = None
        self._segments: list[_Segment] = []
        self._compiled: dict[str, Any] = {}
        self._run_warmup = timer.warmup_steps
        self._cudnn_benchmark = False  # the run's accel.cudnn_benchmark (with convolutions), read at train start
        self._first_plans: dict[tuple[Any, ...], tuple[_Segment, bool]] = {}  # convolution key -> first segment, autotuned
        self._chosen_keys_segment: _Segment | None = None  # the segment whose first step autotuned the chosen keys
        self.judge: CompileJudge | None = None
        self.guard = CandidateGuard(self._runs_candidate)

    # ---- Lightning hooks ---------------------------------------------------------------------
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.phase != "waiting":
            return
        self._run_warmup = self.timer.warmup_steps
        self.timer.warmup_steps = ALL_WARMUP
        convolutions = (self.record.get("capabilities") or {}).get("convolutions", True)
        self._cudnn_benchmark = bool(torch.backends.cudnn.benchmark) and bool(convolutions)
        for name, unit in self.units.items():  # eager during the segments; compile is judged after them
            self._compiled[name] = unit._compiled_call_impl
            unit._compiled_call_impl = None
        self.phase = "segments"
        if trainer.world_size == 1:
            self.guard.install(pl_module)
        self._search = search_steps(self.start, self.stages, self.budget_s, self.margin, where="run", charge="cost")
        self._begin(next(self._search), trainer, pl_module)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self.phase == "judging" and self.judge is not None:
            self.judge.on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
            return
        if self.phase != "segments" or self._segment is None:
            return
        segment = self._segment
        segment.records.append(self.timer.times.records[-1])
        if self.guard.failure is not None:  # the candidate's step failed: its row fails, the incumbent's setting next
            failed = self._measure(segment, False)
            failed.error, self.guard.failure = self.guard.failure, None
            self._advance(failed, trainer, pl_module)
            return
        measured = segment.records[self.warmup:]
        limit = segment.request.stop_above_s
        slower = (limit is not None and len(measured) >= SLOWER_AFTER
                  and statistics.median(r.step_s for r in measured) > limit)
        late = self._over_budget(segment)
        if len(measured) >= self.steps or slower or late:
            self._advance(self._measure(segment, slower), trainer, pl_module)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Training ended during the segments (a run shorter than its trial): the search ends with the
        segment cut, the run's later phases use what it chose, and compile is not judged."""
        if self.phase != "segments" or self._search is None:
            return
        measurement = self._measure(self._segment, False) if self._segment else Measurement(steps_wanted=self.steps)
        try:
            while True:
                self._search.send(measurement)
                measurement = Measurement(steps_wanted=self.steps)
        except StopIteration as done:
            self._finish(done.value, trainer, pl_module, training_over=True)

    # ---- the segments ------------------------------------------------------------------------
    def _runs_candidate(self) -> bool:
        """Whether the step now running belongs to a candidate's segment (not the base: the setting the run
        starts from failing is the run's own error)."""
        return self.phase == "segments" and self._segment is not None and self._segment is not self._segments[0]

    def _begin(self, request: Request, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        self._apply(request.setting, trainer, module)
        self._segment = _Segment(request)
        self._segments.append(self._segment)
        if self._cudnn_benchmark:
            autotune = runs_final_conv_keys(request.setting, request.stage, self.stages)
            set_cudnn_benchmark(autotune)
            self._first_plans.setdefault(_conv_key(request.setting), (self._segment, autotune))

    def _apply(self, setting: dict[str, Any], trainer: pl.Trainer, module: pl.LightningModule) -> None:
        changed = [k for k in LIVE_KNOBS if k in setting and self.current.get(k) != setting[k]]
        for knob in changed:
            switch(knob, setting[knob], trainer, module)
            self.current[knob] = setting[knob]
        release = getattr(module, "release_cuda_graphs", None)  # a DriveModule's (graphs hold the old kernels)
        if release is not None and any(k in GRAPHED_KERNEL_KNOBS for k in changed):
            release()

    def _charged(self, segment: _Segment) -> list[StepRecord]:
        """The segment's steps that count towards its cost: all but the run's very first step (process-wide
        set-up that any run pays at its first step, trial or not) and, once the search has chosen, the first
        step of the segment that autotuned the chosen setting's convolutions (the search a run at that setting
        pays at its first step: ``max``'s)."""
        first_step_is_the_runs = segment is self._segments[0] or segment is self._chosen_keys_segment
        return segment.records[1:] if first_step_is_the_runs else segment.records

    def _excess(self, segment: _Segment, reference: float | None) -> float:
        """What the segment's steps took beyond the same number at ``reference`` (its own median when None)."""
        records = self._charged(segment)
        if not records:
            return 0.0
        if reference is None:
            reference = statistics.median(r.step_s for r in records)
        return sum(r.step_s for r in records) - len(records) * reference

    def _over_budget(self, segment: _Segment) -> bool:
        """A candidate's segment is cut once its cost so far reaches what the budget left it; the base is the
        reference and always completes (its steps train the run at the setting it starts from)."""
        reference = segment.request.reference_s
        return reference is not None and self._excess(segment, reference) >= segment.request.seconds_left

    def _measure(self, segment: _Segment, slower: bool) -> Measurement:
        """The segment's figures, as a short fit of its own would report them (``phase_stats``); its cost, what
        the search charges to the budget, is its time beyond the same steps at the better of the incumbent's
        median and its own (``_price_segments`` prices every row again against the final choice)."""
        records = [dataclasses.replace(r, warmup=i < self.warmup, profiled=False) for i, r in enumerate(segment.records)]
        stats = phase_stats(PhaseTimes("autotune", records=records))
        step = stats.get("step_s") or {}
        cost = max(self._excess(segment, _better(step.get("median"), segment.request.reference_s)), 0.0)
        h2d = (stats.get("h2d_s") or {}).get("mean")
        return Measurement(
            steps_measured=int(stats.get("steps_measured", 0)), steps_wanted=self.steps, step_s=dict(step),
            data_wait_fraction=float(stats.get("data_wait_fraction", float("nan"))),
            h2d_fraction=(h2d / step["mean"]) if h2d is not None and step.get("mean") else float("nan"),
            samples_per_s=float((stats.get("samples_per_s_per_step") or {}).get("median", float("nan"))),
            stopped_slower=slower, cost_s=cost,
            warmup_steps_s=[[round(r.step_s, 3), round(r.data_wait_s, 3)] for r in records if r.warmup])

    def _advance(self, measurement: Measurement, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        assert self._search is not None
        if len(self._segments) == 1 and self.gated:
            self._retune_if_bound(measurement, trainer)
        try:
            request = self._search.send(measurement)
        except StopIteration as done:
            self._finish(done.value, trainer, module)
            return
        self._begin(request, trainer, module)

    def _retune_if_bound(self, base: Measurement, trainer: pl.Trainer) -> None:
        """Stop the run when its first segment shows a bound that only knobs of short fits can lift."""
        for knob, bound in self.gated.items():
            share = base.data_wait_fraction if bound == LOADER_BOUND else base.h2d_fraction
            if share is not None and share == share and share >= self.margin:
                what = "waiting for data" if bound == LOADER_BOUND else "copying to the device"
                spent = sum(r.step_s for r in self._segments[0].records)
                log_dir = getattr(trainer.logger, "log_dir", None) if trainer.logger else None
                raise RetuneBeforeRun(
                    f"the run's first {len(self._segments[0].records)} steps spent {share:.1%} of their time {what} "
                    f"(margin {self.margin:.0%}): accel.{knob} and its stage need trials of their own",
                    spent, len(self._segments[0].records), log_dir)

    # ---- the end of the segments -------------------------------------------------------------
    def _finish(self, result: SearchResult, trainer: pl.Trainer, module: pl.LightningModule,
                training_over: bool = False) -> None:
        self._search, self._segment = None, None
        self.guard.remove()
        chosen = dict(result.chosen)
        self._apply(chosen, trainer, module)
        if self._cudnn_benchmark:  # new shapes from here on (validation, compiled graphs) autotune as in max
            set_cudnn_benchmark(True)
            first, autotuned = self._first_plans.get(_conv_key(chosen), (None, True))
            self.record["cudnn_autotuned"] = autotuned
            self._chosen_keys_segment = first if autotuned else None
        rows = result.trials
        best = next((t for t in rows if t.chosen and t.status == OK), None)
        reference = best.step_s_median if best is not None else None
        excess = self._price_segments(rows, reference)
        compile_row = next((t for t in rows if t.stage == "compile" and t.status == IN_RUN), None)
        judged = compile_row is not None and reference is not None and not training_over
        in_run = dict(self.compile_setting) if judged else {}
        if judged:
            if chosen.get("cuda_graphs") == "on":
                in_run.pop("cuda_graphs", None)  # already replayed: compile alone is what the run adds
            compile_row.change = ", ".join(f"{k}={v}" for k, v in in_run.items())
            compile_row.setting = {**chosen, **in_run}
        elif compile_row is not None:
            compile_row.status, compile_row.reason = SKIPPED, (
                "not judged: training ended before the live stages did" if training_over
                else "not judged: no segment completed to compare it with")
        block = self.record
        before = [t for t in block.get("trials", []) if t.get("where") != "run"]
        block["trials"] = before + [t.to_dict() for t in rows]
        block["in_run_trial"] = {"segments": len(self._segments), "steps": sum(len(s.records) for s in self._segments),
                                 "wall_s": sum(r.step_s for s in self._segments for r in s.records),
                                 "excess_s": excess, "stopped_by_budget": result.stopped_by_budget}
        block["in_run_trial"].update(close_trial_memory(module.device))
        block["cost_s"] = float(block.get("cost_s") or 0.0) + excess
        block["stopped_by_budget"] = bool(block.get("stopped_by_budget")) or result.stopped_by_budget
        block["eager_choice"] = {**(block.get("eager_choice") or {}), **chosen}
        block["eager_step_s"] = reference
        block["in_run"] = in_run
        block["chosen"] = {**block["eager_choice"], **in_run}
        base = block.get("base") or {}
        block["changed"] = {k: v for k, v in block["chosen"].items() if base.get(k) != v}
        if self.on_chosen is not None:
            self.on_chosen({k: v for k, v in chosen.items() if k in LIVE_KNOBS})
        self._report(block)
        if judged:
            self._start_compile(trainer, module, block)
            return
        # no compile after all: the compiled calls stay set aside, the run goes on with the eager choice
        block["compile_in_run"] = {"judged": False, "kept": False, "judged_at_step": int(trainer.global_step),
                                   "eager_step_s": reference, "compiled_step_s": None, "steps": self.steps}
        self.timer.warmup_steps = len(self.timer.times.records) + self._run_warmup
        self.phase = "done"

    def _price_segments(self, rows: Sequence[Any], reference: float | None) -> float:
        """Each timed row's cost: its segment's steps beyond the same number of steps at the chosen setting's
        median (negative when faster). The run's very first step is left out: process-wide set-up (loader
        workers starting, cuDNN and cuBLAS handles) that any run pays at its first step, trial or not; so is
        the first step that autotuned the chosen setting's convolutions (``_charged``)."""
        timed = [t for t in rows if t.status in (OK, CUT) and t.where == "run"]  # one segment each, in order
        excess = 0.0
        for row, segment in zip(timed, self._segments):
            if reference is None:
                continue
            row.cost_s = self._excess(segment, reference)
            excess += row.cost_s
        return excess

    def _start_compile(self, trainer: pl.Trainer, module: pl.LightningModule, block: dict[str, Any]) -> None:
        """The compiled calls back (with fresh CUDA graphs where compile brings them), warm-up, then the judge."""
        for name, unit in self.units.items():
            unit._compiled_call_impl = self._compiled.get(name)
        graphs_before = self.current.get("cuda_graphs")
        if block["in_run"].get("cuda_graphs") == "on" or graphs_before == "on":
            if getattr(module, "graphed_loss", None) is None:
                module.enable_cuda_graphs()
            else:
                module.graphed_loss.release()  # captured around eager kernels: capture the compiled ones anew
        self.timer.warmup_steps = len(self.timer.times.records) + self._run_warmup
        self.judge = CompileJudge(self.timer, self.units, float(block["eager_step_s"]), self.margin, self.steps,
                                  graphs_after_revert=graphs_before == "on", record=block)
        self.phase = "judging"

    def _report(self, block: dict[str, Any]) -> None:
        from drivebench.bench.autotune import render_trials  # the benches import this module

        print(render_trials(block), flush=True)
