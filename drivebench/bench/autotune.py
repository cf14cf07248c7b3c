"""The trial of ``accel=auto`` (and ``bench=autotune``): each candidate is a real short training.

A candidate is the run's config with some accel knobs overridden; it is built by the same
``build_run`` as any run (so ``AccelSettings.resolve`` and the CUDA-graph and compile rules apply as
they do for the presets), trained ``accel.auto_warmup_steps + accel.auto_steps`` steps under the
step timer, and torn down. ``drivebench.accel.autotune`` plans the candidates and decides.
Compile is not timed here: the run starts with it and ``drivebench.accel.compile_judge`` keeps or
undoes it on the run's own steps (``in_run_judge``).
"""

from __future__ import annotations

import datetime as dt
import gc
import json
import logging
import math
import shutil
import statistics
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

import lightning.pytorch as pl
import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn

from drivebench.accel.autotune import (IN_RUN, SKIPPED, SLOWER_AFTER, Capabilities, Measurement, SearchResult, Stage,
                                       error_text, plan_stages, search)
from drivebench.accel.compile import compile_units
from drivebench.accel.cuda_graphs import settle_cuda_graphs
from drivebench.accel.gc_freeze import FreezeHeap
from drivebench.accel.settings import MAX_LOADER_WORKERS, checkpointing_off_fits
from drivebench.data.device_prefetch import DevicePrefetchLoader
from drivebench.errors import ConfigError
from drivebench.perf.callback import StepTimer
from drivebench.perf.loader_wait import LoaderWaitProfiler
from drivebench.perf.summary import phase_stats
from drivebench.signals import RaiseLostStop

log = logging.getLogger("drivebench")
# accel values that do not change what the loader workers make: the step's knobs (model, precision, optimizer),
# the trial's own, and the shared-memory cache's size bound (0.8 x the free shm, which the first cache lowers).
# Candidates that differ only in these can share one running training stream.
LOADER_NEUTRAL = frozenset({
    "name", "shm_cache_max_gb", "cuda_graphs", "compile", "compile_mode", "compile_dynamic", "compile_cache",
    "precision", "tf32", "cudnn_benchmark", "channels_last", "fused_optimizer", "activation_checkpointing",
    "auto_trial", "auto_numerics", "auto_budget_s", "auto_margin", "auto_steps", "auto_warmup_steps"})
TUNED = ("num_workers", "prefetch_factor", "device_transform", "cuda_graphs", "compile", "activation_checkpointing",
         "precision", "tf32", "channels_last", "cudnn_benchmark", "pin_memory", "fused_optimizer")


def with_accel(cfg: DictConfig, setting: dict[str, Any], auto_trial: bool | None = None) -> DictConfig:
    """A copy of ``cfg`` with ``setting`` merged into ``accel`` (the same path a command-line override takes)."""
    extra = {} if auto_trial is None else {"auto_trial": auto_trial}
    return OmegaConf.merge(cfg, {"accel": {**setting, **extra}})


class _StopWhenSlower(pl.Callback):
    """Stop a candidate once the median of its first ``SLOWER_AFTER`` measured steps is over ``limit_s``
    (far slower than the incumbent: more steps would not change the decision)."""

    def __init__(self, timer: StepTimer, limit_s: float | None) -> None:
        self.timer, self.limit_s, self.fired = timer, limit_s, False

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        measured = self.timer.times.measured()
        if self.limit_s is None or self.fired or len(measured) < SLOWER_AFTER:
            return
        if statistics.median(r.step_s for r in measured) > self.limit_s:
            self.fired = True
            trainer.should_stop = True


def _fit_split(timer: StepTimer, fit_started: float, fit_ended: float) -> dict[str, float]:
    """Where one candidate's fit went, in seconds: ``start`` (the Trainer built and set up until its first
    step began), ``warmup`` and ``steps`` (its warm-up and measured steps; the first batch's wait for the
    workers falls in the first warm-up step) and ``end`` (after the last step until ``fit`` returned and
    the workers stopped). Steps are a small share of a candidate on a GPU: this says what the rest is."""
    times = timer.times
    if times.started is None:
        return {}
    warmup = sum(r.step_s for r in times.records if r.warmup)
    steps = sum(r.step_s for r in times.records if not r.warmup)
    last = times.ended if times.ended is not None else times.started + warmup + steps
    return {"start": round(times.started - fit_started, 3), "warmup": round(warmup, 3), "steps": round(steps, 3),
            "end": round(max(fit_ended - last, 0.0), 3)}


def checkpointing_live(run: Any, batch_size: int) -> str:
    """Why ``accel=auto`` cannot time checkpointing off on the run's own steps (it gets short fits), or "": where
    the activations it would keep are known to fit (``activation_checkpointing=auto``'s rule)."""
    if not run.activation_checkpointing.get("model_default"):
        return "the model does not checkpoint activations"
    if run.accel.activation_checkpointing not in ("keep", "off"):
        return f"accel.activation_checkpointing={run.accel.activation_checkpointing} is resolved when the run is built"
    fits, why, _ = checkpointing_off_fits(run.module.net, run.machine, batch_size)
    return "" if fits else why


class AccelTrial:
    """Time the candidates for ``cfg`` and choose; :meth:`run` returns the summary's ``autotune`` block.

    Args:
        cfg: the run's config (its ``accel`` group is the preset the search starts from).
        output_dir: the run directory (trials run in ``<output_dir>/autotune`` and leave nothing there).
        build_run: ``drivebench.app.build_run`` (passed in: the app imports this module).
        report: where the table goes (default: printed).
        share_loaders: a candidate with the previous one's loader settings takes over its running workers
            (False: each starts its own, the baseline of ``scripts/bench_trial_reuse.py``).
        live_in_run: the live stages may be timed on the run's own steps where ``accel.auto_in_run`` says so
            (False: in short fits, as every stage; ``bench.profile`` schedules its steps from the run's start).
    """

    def __init__(self, cfg: DictConfig, output_dir: Path, build_run: Callable[..., Any],
                 report: Callable[[str], None] | None = None, judge_in_run: bool = True,
                 share_loaders: bool = True, live_in_run: bool = True) -> None:
        if cfg.dist.get("strategy") == "ddp":
            raise ConfigError(f"accel.auto_trial=true (accel={cfg.accel.name}) runs its trial in one process and "
                              f"dist={cfg.dist.name} starts several; use dist=single, or run bench=autotune once and "
                              "pass the choice as accel.* overrides")
        self.cfg = with_accel(cfg, {}, auto_trial=False)
        self.output_dir = Path(output_dir)
        self.build_run = build_run
        self.report = report or (lambda text: print(text, flush=True))
        accel = cfg.accel
        self.steps, self.warmup = int(accel.auto_steps), int(accel.auto_warmup_steps)
        self._prebuilt: tuple[dict[str, Any], Any] | None = None
        self.chosen: dict[str, Any] = {}
        self.judge_in_run = judge_in_run  # False under bench=autotune: no run follows to judge compile on
        self.live_in_run = live_in_run  # False under bench.profile: its steps are scheduled from the run's start
        self._image_cache: Any = None  # the base candidate's decoded camera images, shared with the others
        self.image_cache_reused = 0
        self._live: tuple[str, Any] | None = None  # (loader key, the last candidate's running training stream)
        self.share_loaders = share_loaders
        self.loader_reused = 0

    # ---- one candidate -----------------------------------------------------------------------
    def _fit(self, run: Any, seconds_left: float, stop_above_s: float | None = None) -> Measurement:
        wanted = self.warmup + self.steps
        timer = StepTimer("autotune", self.warmup, sync_each_step=False, log_every_n_steps=max(wanted, 1))
        slower = _StopWhenSlower(timer, stop_above_s)
        callbacks: list[pl.Callback] = ([FreezeHeap(timer)] if run.accel.gc_freeze else []) + [timer, slower,
                                                                                 RaiseLostStop()]
        trainer_cfg = self.cfg.trainer
        fit_started = time.perf_counter()
        trainer = pl.Trainer(
            **run.trainer_kwargs(), logger=False, callbacks=callbacks, max_steps=wanted, max_epochs=-1,
            max_time=dt.timedelta(seconds=max(seconds_left, 0.001)), limit_val_batches=0,
            enable_checkpointing=False, enable_progress_bar=False, profiler=LoaderWaitProfiler(),
            gradient_clip_val=trainer_cfg.gradient_clip_val, accumulate_grad_batches=trainer_cfg.accumulate_grad_batches,
        )
        key = self._offer_stream(run)
        fitted = False
        try:
            trainer.fit(run.module, datamodule=run.datamodule)
            fitted = True
        finally:
            loader = trainer.train_dataloader
            if isinstance(loader, DevicePrefetchLoader):
                loader.close()
            run.datamodule.hand_over_streams = False
            stream = run.datamodule.detach_train_stream() if (fitted and key is not None) else None
            if stream is not None:
                self._live = (key, stream)
            run.datamodule.teardown("fit")
        stats = phase_stats(timer.times)
        split = _fit_split(timer, fit_started, time.perf_counter())
        step = stats.get("step_s") or {}
        h2d = (stats.get("h2d_s") or {}).get("mean")
        return Measurement(
            steps_measured=int(stats.get("steps_measured", 0)), steps_wanted=self.steps, step_s=dict(step),
            data_wait_fraction=float(stats.get("data_wait_fraction", math.nan)),
            h2d_fraction=(h2d / step["mean"]) if h2d is not None and step.get("mean") else math.nan,
            samples_per_s=float((stats.get("samples_per_s_per_step") or {}).get("median", math.nan)),
            stopped_slower=slower.fired, cost_split=split,
            warmup_steps_s=[[round(r.step_s, 3), round(r.data_wait_s, 3)] for r in timer.times.records if r.warmup])

    def _offer_stream(self, run: Any) -> str | None:
        """Hand the previous candidate's running training stream to ``run`` when their loaders are the same
        (the candidates differ in step-only knobs); stop it otherwise. Returns ``run``'s loader key, or None
        when its stream is not kept (sharing off, no persistent workers, or device prefetch wraps it)."""
        accel = run.accel
        settings = {k: v for k, v in accel.to_dict().items() if k not in LOADER_NEUTRAL}
        key = None
        if self.share_loaders and accel.num_workers > 0 and accel.persistent_workers and not accel.device_prefetch:
            key = json.dumps(settings, sort_keys=True, default=str)
        live, self._live = self._live, None
        if live is not None:
            if live[0] == key:
                run.datamodule.adopt_train_stream(live[1])
                self.loader_reused += 1
            else:
                live[1].close()
        run.datamodule.hand_over_streams = key is not None
        return key

    def close(self) -> None:
        """Stop the last candidate's training stream, if one is still running."""
        live, self._live = self._live, None
        if live is not None:
            live[1].close()

    def measure(self, setting: dict[str, Any], seconds_left: float, stop_above_s: float | None = None) -> Measurement:
        """Build the candidate as a run, train it a few steps, tear it down; errors are recorded, not raised."""
        t0 = time.monotonic()
        build_started, build_s = time.perf_counter(), 0.0
        run = None
        try:
            if self._prebuilt is not None and self._prebuilt[0] == setting:
                run, self._prebuilt = self._prebuilt[1], None
            else:
                run = self.build_run(with_accel(self.cfg, setting), self._trial_dir(), progress=False)
                share = getattr(run.datamodule.transform, "share_image_cache", None)
                if self._image_cache is not None and share is not None:
                    share(self._image_cache)
                run.datamodule.prepare_data()
                run.datamodule.setup("fit")
                if self._image_cache is not None and getattr(run.datamodule.transform, "image_cache", None) is self._image_cache:
                    self.image_cache_reused += 1
            build_s = time.perf_counter() - build_started
            result = self._fit(run, seconds_left - (time.monotonic() - t0), stop_above_s)
        except Exception as err:  # a candidate that cannot run here: recorded, never chosen
            result = Measurement(error=error_text(err), steps_wanted=self.steps)
        finally:
            compiled = bool(run is not None and run.compiled_units)
            del run
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            if compiled:  # a fresh module per candidate: dynamo's per-code caches would otherwise fill up
                torch._dynamo.reset()
        result.cost_s = time.monotonic() - t0
        if result.cost_split:  # build before the fit; the fit's own parts; what its end left to tear down
            fit_s = sum(result.cost_split.values())
            result.cost_split = {"build": round(build_s, 3), **result.cost_split,
                                 "teardown": round(max(result.cost_s - build_s - fit_s, 0.0), 3)}
        return result

    def _trial_dir(self) -> Path:
        path = self.output_dir / "autotune"
        path.mkdir(parents=True, exist_ok=True)
        return path

    # ---- the search --------------------------------------------------------------------------
    def capabilities(self, run: Any) -> Capabilities:
        machine = run.machine
        on_gpu = machine.accelerator == "cuda"
        kwargs = run.trainer_kwargs()
        devices = kwargs["devices"]
        world = (devices if isinstance(devices, int) else len(devices)) * int(kwargs["num_nodes"])
        graphs, why = settle_cuda_graphs("auto", run.module.supports_static_shapes, world,
                                         int(self.cfg.trainer.accumulate_grad_batches))
        net: nn.Module = run.module.net
        units = compile_units(net)
        return Capabilities(
            on_gpu=on_gpu, cpu_cores=machine.cpu_cores, cores_per_device=machine.cores_per_device,
            bf16=bool(machine.bf16_supported),
            device_transform=hasattr(run.datamodule.transform, "device_transform_for"),
            compile_units=len(units), cuda_graphs="" if graphs else why.removeprefix("off: "),
            convolutions=any(isinstance(m, nn.Conv2d) for m in net.modules()),
            worker_cap=min(machine.cores_per_device, MAX_LOADER_WORKERS) if on_gpu else max(machine.cpu_cores, 1),
            checkpointed=bool(run.activation_checkpointing.get("model_default")),
            checkpointing_live=checkpointing_live(run, int(self.cfg.model.batch_size)),
            fused_optimizer=self._fused_optimizer_blocked(run))

    def _fused_optimizer_blocked(self, run: Any) -> str:
        """Why the fused-optimizer stage cannot run (``AccelSettings.settle_fused_optimizer``'s rule: Lightning
        does not clip with it under mixed precision, which the trial may choose), or ""."""
        clip = OmegaConf.select(self.cfg, "trainer.gradient_clip_val")
        if clip and (run.accel.precision.endswith("-mixed") or run.accel.auto_numerics):
            return f"trainer.gradient_clip_val={clip:g} under mixed precision: Lightning cannot clip with a fused optimizer"
        return ""

    def run(self, retune: Any = None) -> dict[str, Any]:
        """Time the candidates and choose; return the summary's ``autotune`` block.

        With the live stages on the run's own steps (``accel.auto_in_run``), only the stages that cannot
        switch inside a fit get short fits here, and none at all when those are only the loader's (gated by
        the run's first segment). ``retune``: the run stopped on its first segment because the loader bounds
        it (``RetuneBeforeRun``, with what that attempt cost): the loader's stages get their short fits now.
        """
        accel = self.cfg.accel
        t0 = time.monotonic()
        base_run = self.build_run(self.cfg, self._trial_dir(), progress=True)
        base_run.datamodule.prepare_data()  # data generation and preprocessing: the run needs them anyway
        base_run.datamodule.setup("fit")
        prepare_s = time.monotonic() - t0
        caps = self.capabilities(base_run)
        base = {knob: getattr(base_run.accel, knob) for knob in TUNED}
        self._prebuilt = (dict(base), base_run)
        self._image_cache = getattr(base_run.datamodule.transform, "image_cache", None)
        del base_run
        stages, not_allowed = plan_stages(caps, bool(accel.auto_numerics))
        in_run = self.judge_in_run and self.live_in_run and (
            accel.auto_in_run is True or (accel.auto_in_run == "auto" and caps.on_gpu))
        live = [st for st in stages if st.live or st.in_run] if in_run else []
        short = [st for st in stages if st not in live]
        gated: dict[str, str] = {}
        if in_run and retune is None and all(st.bound_by for st in short):
            gated = {st.knob: str(st.bound_by) for st in short}  # tried only if the run's first steps wait for them
            short = []
        try:
            if short or not in_run:
                result = search(base, short, self.measure, float(accel.auto_budget_s), float(accel.auto_margin),
                                not_allowed)
            else:
                result = SearchResult(chosen=dict(base), trials=[], not_allowed=list(not_allowed), cost_s=0.0,
                                      stopped_by_budget=False)
        finally:
            self.close()
        self._prebuilt, self._image_cache = None, None
        gc.collect()
        shutil.rmtree(self.output_dir / "autotune", ignore_errors=True)
        if result.trials and result.trials[0].status == "failed":
            raise ConfigError(f"accel={accel.name}: the trial of the preset's own setting failed ({result.trials[0].reason}); "
                              "nothing to compare against")
        eager = dict(result.chosen)
        if in_run:
            compile_setting = self._compile_setting(caps, eager) if any(st.in_run for st in live) else {}
            self.chosen = {**eager, **compile_setting}
        else:
            compile_setting = self._in_run_setting(result, caps, eager)
            self.chosen = {**eager, **compile_setting}
        block = self.summary(result, base, caps, prepare_s)
        eager_row = next((t for t in result.trials if t.chosen), None)
        block.update(chosen=dict(self.chosen), changed={k: v for k, v in self.chosen.items() if base.get(k) != v},
                     eager_choice=eager, in_run=compile_setting,
                     eager_step_s=eager_row.step_s_median if eager_row is not None else None)
        if retune is not None:
            block["cost_s"] += retune.spent_s
            block["retuned"] = {"reason": retune.reason, "lost_s": retune.spent_s, "steps": retune.steps}
        if in_run:
            block["in_run_trial"] = {"pending": True, "stages": [asdict(st) for st in live], "start": eager,
                                     "gated": gated, "compile_setting": compile_setting}
        self.report(render_trials(block))
        return block

    def _compile_setting(self, caps: Capabilities, eager: dict[str, Any]) -> dict[str, Any]:
        """What the run is built with for compile's judgement: compile, and CUDA graphs where the model allows
        them (compiled kernels are launched one by one too)."""
        setting: dict[str, Any] = {"compile": True}
        if not caps.cuda_graphs and eager.get("cuda_graphs") != "on":
            setting["cuda_graphs"] = "on"
        return setting

    def _in_run_setting(self, result: SearchResult, caps: Capabilities, eager: dict[str, Any]) -> dict[str, Any]:
        """What the run starts with on top of the eager choice, to be judged on its own steps: compile, with
        CUDA graphs where the model allows them (compiled kernels are launched one by one too)."""
        row = next((t for t in result.trials if t.status == IN_RUN and t.stage == "compile"), None)
        if row is None:
            return {}
        if not self.judge_in_run:
            row.status, row.reason = SKIPPED, ("bench=autotune trains no run: under accel=auto the run starts "
                                                 "compiled and keeps compile only if its own steps are faster")
            return {}
        setting = self._compile_setting(caps, eager)
        row.setting = {**eager, **setting}
        row.change = ", ".join(f"{k}={v}" for k, v in setting.items())
        return setting

    def summary(self, result: SearchResult, base: dict[str, Any], caps: Capabilities, prepare_s: float) -> dict[str, Any]:
        accel = self.cfg.accel
        return {
            "preset": str(accel.name),
            "base": base,
            "chosen": result.chosen,
            "changed": result.changes(base),
            "budget_s": float(accel.auto_budget_s),
            "cost_s": result.cost_s,
            "cost_split": _total_split(result.trials),
            "prepare_s": prepare_s,
            "image_cache_reused": self.image_cache_reused,
            "loader_reused": self.loader_reused,
            "stopped_by_budget": result.stopped_by_budget,
            "margin": float(accel.auto_margin),
            "steps": self.steps,
            "warmup_steps": self.warmup,
            "auto_numerics": bool(accel.auto_numerics),
            "capabilities": asdict(caps),
            "not_allowed": result.not_allowed,
            "trials": [t.to_dict() for t in result.trials],
        }


def _total_split(trials: list[Any]) -> dict[str, float]:
    """The candidates' cost splits summed key by key (what the trial's cost went to)."""
    total: dict[str, float] = {}
    for trial in trials:
        for key, seconds in (trial.cost_split or {}).items():
            total[key] = round(total.get(key, 0.0) + seconds, 3)
    return total


def _ms(value: float | None) -> str:
    return "" if value is None else f"{value * 1e3:.1f}"


def render_trials(block: dict[str, Any]) -> str:
    """The trial table as printed at the start of the run."""
    rows = [("stage", "candidate", "timed on", "status", "step ms median [p10-p90]", "data wait", "cost s", "note")]
    for t in block["trials"]:
        spread = (f"{_ms(t['step_s_median'])} [{_ms(t['step_s_p10'])}-{_ms(t['step_s_p90'])}]"
                  if t["step_s_median"] is not None else "")
        wait = f"{t['data_wait_fraction']:.0%}" if t["data_wait_fraction"] is not None else ""
        status = t["status"] + (" <- chosen" if t["chosen"] else "")
        timed = "" if t["status"] in (SKIPPED, IN_RUN) and not t["step_s_median"] else (
            "run steps" if t.get("where") == "run" else "own fit")
        rows.append((t["stage"], t["change"], timed, status, spread, wait, f"{t['cost_s']:+.1f}" if t.get("where") == "run"
                     and t["cost_s"] else f"{t['cost_s']:.1f}" if t["cost_s"] else "", (t["reason"] or "")[:110]))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    changed = ", ".join(f"{k}={v}" for k, v in block["changed"].items()) or "nothing: the preset's own values"
    head = (f"accel trial ({block['preset']}): {len(block['trials'])} rows, {block['cost_s']:.1f} s of "
            f"accel.auto_budget_s={block['budget_s']:g}" + (" (budget reached)" if block["stopped_by_budget"] else "")
            + f"; margin {block['margin']:.0%}; training with: {changed}")
    rule = "-" * max(len(head), *(len(line) for line in lines))
    not_allowed = [f"  not tried here: {n['stage']} ({n['reason']})" for n in block["not_allowed"]]
    split = block.get("cost_split") or {}
    spent = ([f"  the candidates' cost: " + ", ".join(f"{k} {v:.1f} s" for k, v in split.items())
              + " (steps: the measured ones)"] if split else [])
    live = block.get("in_run_trial") or {}
    caps = block.get("capabilities") or {}
    if live and caps.get("checkpointed") and caps.get("checkpointing_live"):
        not_allowed.append(f"  activation_checkpointing in short fits, not on the run's steps: {caps['checkpointing_live']}")
    if live.get("pending"):
        spent.append("  timed next, on the run's own first steps: " + ", ".join(st["knob"] for st in live["stages"]))
    elif live:
        spent.append(f"  on the run's own steps: {live['segments']} segments, {live['steps']} steps in {live['wall_s']:.1f} s, "
                     f"{live['excess_s']:+.1f} s beyond the same steps at the choice (the cost of those rows)"
                     + (f"; their peak {live['peak_device_gb']:.1f} GiB" if live.get("peak_device_gb") else ""))
    if block.get("cudnn_autotuned") is False:
        spent.append("  cuDNN plans: the chosen setting's convolutions first ran in a segment that did not autotune "
                     "(a stage kept a value other than max's): the run trains with cuDNN's heuristic plans")
    if block.get("retuned"):
        spent.append(f"  restarted: {block['retuned']['reason']} ({block['retuned']['lost_s']:.1f} s lost)")
    return "\n".join([rule, head, rule, *lines, *not_allowed, *spent, rule])


def in_run_judge(run: Any, timer: StepTimer, on_chosen: Callable[[dict[str, Any]], None] | None = None) -> pl.Callback | None:
    """What ``accel=auto`` left to the run's own steps (``autotune``): the live stages and compile
    (:class:`~drivebench.accel.in_run_trial.InRunTrial`), or compile alone
    (:class:`~drivebench.accel.compile_judge.CompileJudge`); None when it left nothing."""
    block = run.autotune
    if not block:
        return None
    units = compile_units(run.module.net)
    plan = block.get("in_run_trial") or {}
    if plan.get("pending"):
        from drivebench.accel.in_run_trial import SETTINGS_KNOBS, InRunTrial

        accel = run.accel
        stages = [Stage(**{**st, "values": tuple(st["values"])}) for st in plan["stages"]]
        built = {knob: getattr(accel, knob) for knob in SETTINGS_KNOBS}
        built["cuda_graphs"] = "on" if getattr(run.module, "graphed_loss", None) is not None else "off"
        left_s = float(block["budget_s"]) - float(block.get("cost_s") or 0.0)  # what the short fits left
        return InRunTrial(timer, stages, plan["start"], built, block, margin=float(block["margin"]),
                          steps=int(block["steps"]), warmup=int(block["warmup_steps"]), budget_s=left_s,
                          units=units, compile_setting=plan["compile_setting"], gated=plan["gated"], on_chosen=on_chosen)
    if not (block.get("in_run") or {}).get("compile") or block.get("eager_step_s") is None:
        return None
    from drivebench.accel.compile_judge import CompileJudge

    graphs_back = (block.get("eager_choice") or {}).get("cuda_graphs") == "on"
    return CompileJudge(timer, units, block["eager_step_s"], float(block["margin"]), int(block["steps"]),
                        graphs_after_revert=graphs_back, record=block)
