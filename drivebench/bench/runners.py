"""The three benchmarks. Each measures phases with the same clock and writes one ``summary.json``.

Each phase is one Lightning Trainer with a :class:`~drivebench.perf.callback.StepTimer` of its own
(the owner of that phase's step clock) and a view of the run's one logger that puts the phase in
front of every tag (:mod:`drivebench.bench.phase_logger`): one TensorBoard event stream per run.

* :class:`TrainBench` (``bench=train``): bounded training, every step timed; validation at the end;
  then the ceiling (the same model on one device-resident batch) and efficiency = train / ceiling.
* :class:`CeilingBench` (``bench=ceiling``): only the ceiling.
* :class:`LoaderBench` (``bench=loader``): only the data pipeline, no model.
"""

from __future__ import annotations

import dataclasses

import datetime as dt
import logging
import math
import signal
import sys
import time
from typing import Any

import lightning.pytorch as pl
import torch
from omegaconf import OmegaConf

from drivebench.accel.compile import compile_report
from drivebench.accel.gc_freeze import FreezeHeap
from drivebench.app import Run, build
from drivebench.bench.phase_logger import CEILING, FIT, VALIDATE, phase_logger
from drivebench.bench.running_summary import RunningSummary
from drivebench.ckpt.identity import RunIdentity
from drivebench.ckpt.resume import ResumePlan, check_model_fits, resolve_resume
from drivebench.ckpt.state import RngState
from drivebench.data.device_prefetch import DevicePrefetchLoader
from drivebench.data.epoch_stream import EpochStream
from drivebench.data.transforms.device import DEVICE_DECODE
from drivebench.dist import gather_objects
from drivebench.errors import ConfigError, DataError, data_error_in_worker
from drivebench.schemas import resolve_profile
from drivebench.schemas import resolve_val_batches as _resolve_val_batches
from drivebench.secrets import redact, redact_argv
from drivebench.signals import (STOP, Interrupted, RaiseLostStop, StopOnSignal, exit_code, requeue_slurm_job,
                                signal_name)
from drivebench.perf.bottleneck import diagnose, efficiency_note
from drivebench.perf.callback import StepTimer
from drivebench.perf.ceiling import CeilingDataModule, representative_batch
from drivebench.perf.loader_wait import LoaderWaitProfiler
from drivebench.perf.machine import filesystem_of
from drivebench.perf.profiler import ProfileSteps
from drivebench.perf.progress import StepProgressBar
from drivebench.perf.stats import describe
from drivebench.perf.summary import (FAILED, RUNNING, SCHEMA_VERSION, loss_summary, phase_stats, render_table,
                                     validation_stats, write_summary)
from drivebench.perf.system import SystemMonitor
from drivebench.perf.targets import parse_target

log = logging.getLogger("drivebench")


STEP_TIMER = "step_timer"  # the callbacks group's entry the bench hands each phase's clock to


def _resolve_count(value: Any, gpu_default: int, cpu_default: int, on_gpu: bool) -> int:
    """``auto`` -> the machine's default (the value itself was checked by its schema, TrainBenchConfig)."""
    if value == "auto":
        return gpu_default if on_gpu else cpu_default
    return value


def _resolve_targets(value: Any) -> list[str]:
    """``bench.targets``: quality targets checked before any work, recorded as written without spaces
    (summary ``targets``)."""
    if value is None:
        return []
    labels = []
    for item in [value] if isinstance(value, str) else list(value):
        try:
            labels.append(parse_target(item).label)
        except ValueError as err:
            raise ConfigError(f"bench.targets={item!r} is not valid: {err}") from None
    return labels


def step_timer(run: Run, phase: str, warmup_steps: int, monitor: SystemMonitor, **kwargs: Any) -> StepTimer:
    """``callbacks.step_timer`` (a partial StepTimer) for one phase: ``perf`` (training) or ``ceiling``."""
    return build(run.cfg.callbacks[STEP_TIMER])(phase=phase, warmup_steps=warmup_steps, monitor=monitor, **kwargs)


def configured_callbacks(run: Run) -> list[pl.Callback]:
    """Every other entry of the callbacks group, in order (an entry set to null is left out; the
    progress bar also with ``+trainer.enable_progress_bar=false``, which Lightning refuses beside one)."""
    callbacks = [build(node) for name, node in run.cfg.callbacks.items() if name != STEP_TIMER and node is not None]
    if OmegaConf.select(run.cfg, "trainer.enable_progress_bar") is False:
        callbacks = [cb for cb in callbacks if not isinstance(cb, pl.callbacks.ProgressBar)]
    return callbacks


class TrainBench:
    """Args (drivebench/conf/bench/train.yaml documents each): mode, warmup_steps, steps, max_minutes,
    val_batches, ceiling, ceiling_warmup_steps, ceiling_steps, loader_batches, sync_each_step, profile,
    targets.

    The Lightning Trainer of each phase comes from the trainer group (a partial
    ``lightning.pytorch.Trainer``) and its callbacks from the callbacks group."""

    runs_training = True
    runs_ceiling = True
    runs_loader = False

    def __init__(self, mode: str = "train", warmup_steps: int = 10, steps: Any = "auto",
                 max_minutes: float | None = None, val_batches: Any = 20, ceiling: bool = True,
                 ceiling_warmup_steps: int = 5, ceiling_steps: Any = "auto", loader_batches: Any = "auto",
                 sync_each_step: bool = False, profile: Any = None, targets: Any = None) -> None:
        self.mode = mode
        self.warmup_steps = warmup_steps
        self.steps = steps
        self.max_minutes = max_minutes
        self.ceiling = ceiling
        self.ceiling_warmup_steps = ceiling_warmup_steps
        self.ceiling_steps = ceiling_steps
        self.loader_batches = loader_batches
        self.sync_each_step = sync_each_step
        self.profile = profile
        self.targets = _resolve_targets(targets)  # here, so that a bad one stops the run before it is built
        self.val_batches = _resolve_val_batches(val_batches)

    # ---- entry -------------------------------------------------------------------------------
    def run(self, run: Run) -> dict[str, Any]:
        """Execute the phases; write and return the summary. A stop signal ends the run early with a
        summary of what ran (``status: interrupted``) and :class:`Interrupted` carrying its one line."""
        on_gpu = run.machine.accelerator == "cuda"
        self.steps = _resolve_count(self.steps, 300, 30, on_gpu)
        self.ceiling_steps = _resolve_count(self.ceiling_steps, 50, 10, on_gpu)
        self.loader_batches = _resolve_count(self.loader_batches, 200, 30, on_gpu)
        self.warmup_steps = _resolve_count(self.warmup_steps, 0, 0, on_gpu)
        self.profile = resolve_profile(self.profile)
        summary = self._base_summary(run)
        monitor = SystemMonitor(torch.cuda.current_device() if on_gpu else None)
        logger = run.logger()
        dm = run.datamodule
        self.stopped: dict[str, Any] | None = None  # training stopped on a signal (StopOnSignal's record)
        self._running: RunningSummary | None = None  # the summary written when training starts
        self._trainer: pl.Trainer | None = None
        self._phase = "set-up"
        trained_step = 0  # the global step of the weights after training (validation logs there)
        try:
            if self.runs_training:  # before any work: a resume=<path> that cannot be read is a bad value
                self._checkpoint_io, self._resume = self._resolve_checkpoints(run, summary)
            self._phase = "data preparation"
            t0 = time.perf_counter()
            dm.prepare_data()
            dm.setup("fit")
            summary["data"] = run.datamodule.source.describe()
            summary["data"]["prepare_s"] = time.perf_counter() - t0
            summary["data"]["train_samples"] = len(dm.train_set)
            summary["data"]["val_samples"] = len(dm.val_set)
            if self.runs_loader:
                self._phase = "the loader phase"
                summary["loader"] = self._loader_phase(run)
            if self.runs_training:
                self._phase = "training"
                trained_step = self._train_phase(run, logger, monitor, summary)
            if self.stopped is not None:  # stopped on a signal at a step boundary: nothing more runs
                raise self._interrupted(run, logger, summary, self.stopped["signum"])
            if self.runs_ceiling and (self.ceiling or not self.runs_training):
                # right after training, under the same conditions; the ceiling's steps on one batch
                # must not change the weights that validation then scores
                weights = {k: v.detach().clone() for k, v in run.module.state_dict().items()}
                self._phase = "the ceiling phase"
                self._ceiling_phase(run, logger, monitor, summary)
                run.module.load_state_dict(weights)
            if self.runs_training and self.val_batches:
                self._phase = "validation"
                summary["val"] = self._validate(run, logger, trained_step)
                summary["val_notes"] = run.module.metric_notes(summary["val"])
        except Interrupted as stop:  # a signal outside a training phase, or a second one during it
            if stop.message is None:
                raise self._interrupted(run, logger, summary, stop.signum) from None
            raise
        except Exception as error:
            if STOP.received is None:
                self._failed(run, summary, error)
                raise
            # a stop signal came first and its Interrupted was lost: raised inside a hook that ignores
            # exceptions (an at-fork callback while the loader forks its workers); what failed next is its
            # consequence (a scheduler signals the whole process group: the loader workers died of it)
            raise self._interrupted(run, logger, summary, STOP.received) from None
        finally:
            monitor.stop()
        summary["data"]["shm_cache"] = dm.cache_stats()
        summary["data"]["worker_start_method"] = dm.worker_start_method
        skipped_val = _skip_counts(dm.val_set)
        if skipped_val is not None:
            summary["data"]["skipped_in_validation"] = skipped_val
        train, ceiling = summary.get("train") or {}, summary.get("ceiling") or {}
        if train.get("samples_per_s") and ceiling.get("samples_per_s"):
            summary["efficiency"] = (train.get("global_samples_per_s") or train["samples_per_s"]) / (
                ceiling.get("global_samples_per_s") or ceiling["samples_per_s"])
            note = efficiency_note(summary)
            if note is not None:  # only above 100% (docs/summary.md)
                summary["efficiency_note"] = note
        self._complete(run, summary)
        if run.p2p:
            summary["dist"] = {"p2p": run.p2p}
        if not getattr(self, "is_global_zero", True):
            return summary  # rank 0 writes the one summary of the run
        path = write_summary(run.output_dir / "summary.json", summary)
        summary["paths"]["summary"] = str(path)
        if logger:
            logger.finalize("success")
        print(render_table(summary), flush=True)
        return summary

    def _resolve_checkpoints(self, run: Run, summary: dict[str, Any]) -> tuple[Any, ResumePlan | None]:
        """The checkpoint IO, bound to this run's identity, and what ``resume`` resolved to (summary ``run``)."""
        cfg = run.cfg
        checkpoint_io = build(cfg.ckpt.io, _convert_="all")
        identity = RunIdentity.of_config(OmegaConf.to_container(cfg, resolve=True), _world(run))
        plan = resolve_resume(cfg, checkpoint_io.store, identity)  # may adopt the checkpoint's run id
        if plan is not None and plan.checkpoint is not None:  # another model: refused before data preparation
            module = run.module
            check_model_fits(module.state_dict(), plan.checkpoint, module.optimizer_group_sizes(), str(plan.path))
            plan.checkpoint = None  # Lightning reads it again at the restore
        checkpoint_io.bind(identity)
        summary["run"]["run_id"] = identity.run_id
        summary["run"]["fingerprint"] = identity.fingerprint
        summary["run"]["resumed_from"] = plan.path if plan is not None else None
        summary["run"]["resume"] = plan.to_summary() if plan is not None else None
        return checkpoint_io, plan

    def _complete(self, run: Run, summary: dict[str, Any]) -> None:
        """A completed run's last settings, then its bottleneck verdict: after ``_finish``, so that the verdict's
        advice reads what the run trained with (``accel=auto``'s choice), not what it started from (an H100 run of
        2026-12-05 trained in bf16, compiled, and was advised to try both)."""
        self._finish(run, summary, "completed")
        summary["bottleneck"] = diagnose(summary)

    @staticmethod
    def _record_acceleration(run: Run, summary: dict[str, Any]) -> None:
        """What the module and the compiler did so far (padding, CUDA graphs, compile phases and cache hits), for a
        run that ends in any way: a run stopped by its cap keeps where its warm start went (five capped QCNet
        runs of 2026-12-06 wrote summaries without it)."""
        module = getattr(run, "module", None)
        if module is None:
            return
        settings = summary.setdefault("settings", {})
        settings.update(module.summary_settings())
        if getattr(run, "compiled_units", None):
            settings["compile_report"] = compile_report()
        if getattr(module, "graphed_loss", None) is not None:
            settings["cuda_graphs"] = {"status": run.cuda_graphs, **module.cuda_graphs_report()}

    def _finish(self, run: Run, summary: dict[str, Any], status: str) -> None:
        try:
            self._record_acceleration(run, summary)
        except Exception:  # a run that failed or was stopped: its summary matters more than these facts
            if status == "completed":
                raise
            log.warning("summary: the acceleration facts of this %s run were not recorded", status, exc_info=True)
        summary["run"]["finished"] = dt.datetime.now().isoformat(timespec="seconds")
        summary["run"]["wall_s"] = time.time() - run.started
        summary["run"]["status"] = status
        if run.autotune is not None:  # completed or interrupted: the trial ran either way
            summary["autotune"] = {**run.autotune, "cost_fraction_of_run": run.autotune["cost_s"] / summary["run"]["wall_s"]}
            verdict = run.autotune.get("compile_in_run") or {}
            accel = (summary.get("settings") or {}).get("accel")
            if verdict.get("kept") is False and accel is not None:  # trained eagerly after that step
                accel.update({k: v for k, v in run.autotune["eager_choice"].items() if k in ("compile", "cuda_graphs")})
                summary["settings"]["compile_undone_at_step"] = verdict["judged_at_step"]
            in_run = run.autotune.get("in_run_trial") or {}
            if accel is not None and in_run and not in_run.get("pending"):  # live knobs chosen on the run's steps
                accel.update({k: v for k, v in run.autotune["chosen"].items() if k in accel})
                summary["settings"]["numerics_changed_by"] = self._numerics_changes(run)
                summary["settings"]["fused_optimizer"] = run.fused_optimizer
                summary["settings"]["activation_checkpointing"] = run.activation_checkpointing  # _adopt_live_knobs'

    def _failed(self, run: Run, summary: dict[str, Any], error: BaseException) -> None:
        """A run that failed after training started: its ``running`` summary becomes ``failed`` with the error's
        first line (the report lists it and still follows the validation it logged). Before training nothing
        was written; bad input (a bad value, undecodable data) removes what was, here as there."""
        running = self._running
        if running is None or not running.written:
            return
        if isinstance(error, (ConfigError, DataError)) or data_error_in_worker(error) is not None:
            # bad input found mid-run (a file a loader worker cannot decode): its one line is the whole outcome,
            # as for a value refused before training; no summary stays behind to be taken for a result
            running.path.unlink(missing_ok=True)
            return
        first_line = (str(error).strip().splitlines() or [""])[0][:300]
        summary["run"]["error"] = f"{type(error).__name__}: {first_line}" if first_line else type(error).__name__
        self._finish(run, summary, FAILED)
        write_summary(running.path, summary)

    def _interrupted(self, run: Run, logger: Any, summary: dict[str, Any], signum: int) -> Interrupted:
        """The end of a run stopped by ``signum``: the summary (``status: interrupted``, the step reached, the
        final checkpoint), a SLURM requeue when asked for, and the exception whose line the app prints."""
        STOP.deferring += 1  # a further signal no longer breaks off writing what is left to write
        try:
            trainer = self._trainer
            step = trainer.global_step if trainer is not None else None
            saved = ((summary.get("checkpoints") or {}).get("each") or [])
            final = saved[-1] if saved and saved[-1]["step"] == step else None
            record: dict[str, Any] = {
                "signal": signal_name(signum), "exit_code": exit_code(signum), "step": step,
                "at_step_boundary": self.stopped is not None, "checkpoint": final["path"] if final else None,
                "requeue": None,
            }
            zero = getattr(self, "is_global_zero", True) if trainer is None else trainer.is_global_zero
            if run.cfg.get("requeue") and signum == signal.SIGUSR1 and zero:
                record["requeue"] = requeue_slurm_job()
            summary["run"]["interrupted"] = record
            self._finish(run, summary, "interrupted")
            where = ""
            if zero:
                path = write_summary(run.output_dir / "summary.json", summary)
                summary["paths"]["summary"] = str(path)
                where = f"; summary {path}"
                if logger:
                    logger.finalize("interrupted")
            if self.stopped is not None:
                what = f"at step {step}"
            elif self._phase == "training" and step is not None:
                why = "a second signal" if STOP.count > 1 else "a failure after the signal"
                what = f"during step {step + 1} ({why}: not at a step boundary)"
            else:
                what = f"during {self._phase}" + (f" (training reached step {step})" if step is not None else "")
            ckpt = f"; checkpoint {record['checkpoint']}" if record["checkpoint"] else (
                "; no checkpoint of this step (checkpoints are off)" if run.cfg.ckpt.get("callback") is None or step is None
                else "; no checkpoint of this step")
            requeued = f"; {record['requeue']}" if record["requeue"] else ""
            resume = "; continue with resume=auto" if record["checkpoint"] else ""
            return Interrupted(signum, f"{what}{ckpt}{where} (status interrupted){requeued}{resume}")
        finally:
            STOP.deferring -= 1

    # ---- phases ------------------------------------------------------------------------------
    def _train_phase(self, run: Run, logger: Any, monitor: SystemMonitor, summary: dict[str, Any]) -> int:
        """Train; fill ``summary``; return the trainer's global step at the end."""
        cfg = run.cfg
        profiler = ProfileSteps(self.profile, self.warmup_steps, run.output_dir) if self.profile else None
        timer = step_timer(run, "train", self.warmup_steps, monitor,
                           profiled_steps=profiler.occupied_steps if profiler else 0)
        freeze = FreezeHeap(timer) if run.accel.gc_freeze else None
        from drivebench.bench.autotune import in_run_judge  # the benches are imported by it

        # accel=auto: the live knobs timed on this run's own first steps, then compile kept or undone on them
        judge = in_run_judge(run, timer, on_chosen=lambda live: _adopt_live_knobs(run, live))
        # the profiler before the timer: its trace export then falls into a profiled (excluded) step
        callbacks: list[pl.Callback] = (([freeze] if freeze else []) + ([profiler] if profiler else []) + [timer]
                                        + ([judge] if judge else []) + configured_callbacks(run))
        checkpoint_io = self._checkpoint_io  # the Trainer's CheckpointIO plugin, bound to this run's identity
        ckpt = build(cfg.ckpt.callback, _convert_="all") if cfg.ckpt.get("callback") else None
        callbacks.append(RngState())  # RNG states in every checkpoint, restored on resume, also for ckpt=none
        stop = StopOnSignal()  # a stop signal ends training at the next step boundary
        callbacks += [stop, RaiseLostStop()]
        self._running = RunningSummary(run.output_dir / "summary.json", summary)  # what a killed run leaves
        callbacks.append(self._running)
        if ckpt is not None:
            callbacks.append(ckpt)
        resume_from = self._resume.path if self._resume is not None else None
        max_steps = cfg.trainer.max_steps
        if max_steps is None:  # bench.steps measured steps after warm-up and the profiled steps
            max_steps = self.warmup_steps + self.steps + (profiler.occupied_steps if profiler else 0)
        validate_during_fit = cfg.trainer.check_val_every_n_epoch is not None or cfg.trainer.val_check_interval
        make_trainer = build(cfg.trainer)  # functools.partial(lightning.pytorch.Trainer, **trainer group)
        trainer = make_trainer(
            **run.trainer_kwargs(), logger=phase_logger(logger, FIT), callbacks=callbacks, max_steps=max_steps,
            max_time=dt.timedelta(minutes=self.max_minutes) if self.max_minutes else None,
            limit_val_batches=self.val_batches if validate_during_fit else 0,
            enable_checkpointing=False, profiler=LoaderWaitProfiler(), plugins=[checkpoint_io],
        )
        if torch.cuda.is_available() and run.machine.accelerator == "cuda":
            torch.cuda.reset_peak_memory_stats()
        if run.job is not None:
            run.job.track(trainer)
        # the checkpoint IO reads resume_from (remote ones with ckpt.storage_options); Lightning restores
        # model, optimizer, schedulers, loops, the training loader's position and the RNG states
        self._trainer = trainer
        trainer.fit(run.module, datamodule=run.datamodule, ckpt_path=resume_from)
        self.is_global_zero = trainer.is_global_zero
        self.stopped = stop.stopped
        prefetch = trainer.train_dataloader
        if isinstance(prefetch, DevicePrefetchLoader):
            summary["data"]["device_prefetch"] = prefetch.stats()
            prefetch.close()
            prefetch = prefetch.loader
        if isinstance(prefetch, EpochStream) and prefetch.across_epochs:  # one iterator for every epoch: 1 start
            summary["data"]["epoch_stream"] = {"iterator_starts": prefetch.iterator_starts, "next_batch": list(prefetch.position)}
        summary["train"] = phase_stats(timer.times, monitor)
        if timer.validations:  # trainer.val_check_interval / check_val_every_n_epoch: where those validations went
            summary["train"]["validation"] = validation_stats(timer.validations)
        if profiler is not None and trainer.is_global_zero:
            summary["profile"] = profiler.summarise(timer.times, monitor, phase_logger(logger, FIT),
                                                    trainer.global_step)
        if freeze is not None:
            summary["train"]["gc_freeze"] = freeze.summary()
        skipped = _skip_counts(run.datamodule.train_set)
        if trainer.world_size > 1:
            summary["ranks"] = self._gather_ranks(summary["train"], trainer, skipped)
            summary["train"]["global_samples_per_s"] = summary["ranks"]["global_samples_per_s"]
            skipped = summary["ranks"].pop("skipped")
        if skipped is not None:
            summary["data"]["skipped_in_training"] = skipped
        summary["loss"] = loss_summary(timer.times.records)
        if run.machine.accelerator == "cuda":
            summary["memory"]["peak_device_gb"] = torch.cuda.max_memory_allocated() / 2**30
            summary["memory"]["peak_device_reserved_gb"] = torch.cuda.max_memory_reserved() / 2**30
        if ckpt is not None:
            summary["checkpoints"] = ckpt.summary()
        return trainer.global_step

    @staticmethod
    def _gather_ranks(stats: dict[str, Any], trainer: pl.Trainer, skipped: dict[str, int] | None = None) -> dict[str, Any]:
        """Every rank's own figures, on rank 0: global throughput and the slowest rank (and the samples
        ``data.on_corrupt=skip`` skipped, summed over ranks, under ``skipped``)."""
        mine = {
            "skipped": skipped,
            "rank": trainer.global_rank,
            "samples": stats.get("samples"),
            "wall_s": stats.get("wall_s"),
            "samples_per_s": stats.get("samples_per_s"),
            "step_s_median": (stats.get("step_s") or {}).get("median"),
            "data_wait_s_median": (stats.get("data_wait_s") or {}).get("median"),
            "data_wait_fraction": stats.get("data_wait_fraction"),
            "compute_s_median": (stats.get("compute_s") or {}).get("median"),
        }
        per_rank = sorted(gather_objects(mine), key=lambda r: r["rank"])
        walls = [r["wall_s"] for r in per_rank if r["wall_s"]]
        samples = sum(r["samples"] or 0 for r in per_rank)
        slowest = max(per_rank, key=lambda r: (r["data_wait_fraction"] or 0.0, r["step_s_median"] or 0.0))
        counted = [r.pop("skipped") for r in per_rank]
        total = None if all(c is None for c in counted) else {
            kind: sum((c or {}).get(kind, 0) for c in counted) for kind in sorted({k for c in counted if c for k in c})}
        return {
            "skipped": total,
            "world_size": trainer.world_size,
            "per_rank": per_rank,
            "global_samples_per_s": samples / max(walls) if walls else None,
            "slowest_rank": slowest["rank"],
            "slowest_rank_reason": "highest data-wait fraction (then step time)",
        }

    def _validate(self, run: Run, logger: Any, trained_step: int) -> dict[str, float]:
        """The end-of-run validation, logged at the step of the weights it scores. Under ``no_grad`` as the fit's
        validations run (Lightning's fit loop turns inference mode off): inference tensors would fail the
        compiled units' guards and compile each of them again (SparseDrive: five graphs)."""
        trainer = pl.Trainer(**run.trainer_kwargs(), logger=phase_logger(logger, VALIDATE, trained_step),
                             limit_val_batches=self.val_batches, callbacks=[RaiseLostStop()],
                             enable_checkpointing=False, enable_progress_bar=False, inference_mode=False)
        if run.job is not None:
            run.job.track(trainer)
        results = trainer.validate(run.module, datamodule=run.datamodule, verbose=False)
        metrics = results[0] if results else {}
        return {k.removeprefix("val/"): float(v) for k, v in metrics.items()}

    def _ceiling_phase(self, run: Run, logger: Any, monitor: SystemMonitor, summary: dict[str, Any]) -> None:
        loader = run.datamodule.train_dataloader(device_prefetch=False)  # a host batch, made resident below
        steps = self.ceiling_warmup_steps + self.ceiling_steps
        train_elements = ((summary.get("train") or {}).get("batch_elements") or {}).get("median")
        host_batch, chosen = representative_batch(loader, train_elements if train_elements == train_elements else None)
        ceiling = CeilingDataModule(host_batch, steps, run.datamodule.device_transform)
        timer = step_timer(run, "ceiling", self.ceiling_warmup_steps, monitor)
        callbacks: list[pl.Callback] = ([FreezeHeap(timer)] if run.accel.gc_freeze else []) + [timer, RaiseLostStop()]
        bars = [cb for cb in configured_callbacks(run) if isinstance(cb, StepProgressBar)]
        for bar in bars:
            bar.phase = CEILING
        callbacks += bars
        trainer = pl.Trainer(
            **run.trainer_kwargs(), logger=phase_logger(logger, CEILING), callbacks=callbacks, max_steps=steps,
            max_epochs=-1,
            limit_val_batches=0, enable_checkpointing=False, log_every_n_steps=run.cfg.trainer.log_every_n_steps,
            profiler=LoaderWaitProfiler(),
        )
        if run.job is not None:
            run.job.track(trainer)
        trainer.fit(run.module, datamodule=ceiling)
        self.is_global_zero = trainer.is_global_zero
        summary["ceiling"] = phase_stats(timer.times, monitor)
        summary["ceiling"]["resident_batch"] = chosen
        if trainer.world_size > 1:
            summary["ceiling"]["global_samples_per_s"] = self._gather_ranks(summary["ceiling"], trainer)[
                "global_samples_per_s"]

    def _loader_phase(self, run: Run) -> dict[str, Any]:
        dm = run.datamodule
        device = torch.device("cuda", torch.cuda.current_device()) if run.machine.accelerator == "cuda" else None
        loader = dm.train_dataloader(device_prefetch=False)  # the host pipeline alone
        iterator = iter(loader)
        warm = self.warmup_steps
        times, sizes = [], []
        t_prev = time.perf_counter()
        for i in range(warm + self.loader_batches):
            STOP.resurface()  # a stop lost while the loader forked its workers (signals.RaiseLostStop's check)
            try:
                batch = next(iterator)
            except StopIteration:
                iterator = iter(loader)
                batch = next(iterator)
            if device is not None:
                batch = dm.move_batch(batch, device)
            if dm.device_transform is not None:  # part of the pipeline, wherever it runs
                batch = dm.device_transform(batch)
            if device is not None:
                torch.cuda.synchronize()
            t_now = time.perf_counter()
            if i >= warm:
                times.append(t_now - t_prev)
                sizes.append(run.module.batch_size(batch))
            t_prev = t_now
        total = sum(times)
        return {
            "batches_measured": len(times),
            "warmup_batches": warm,
            "batch_s": describe(times),
            "samples_per_s": sum(sizes) / total if total > 0 else math.nan,
            "includes_device_transfer": device is not None,
            "includes_device_transform": dm.device_transform is not None,
        }

    # ---- summary head ------------------------------------------------------------------------
    @staticmethod
    def _decodes_on_device(run: Run) -> bool:
        return run.datamodule.device_transform is not None and hasattr(
            run.datamodule.transform, "device_transform_for")  # a camera pipeline's decode

    @classmethod
    def _numerics_changes(cls, run: Run) -> list[str]:
        return run.accel.numerics_changes(
            compiles=bool(run.compiled_units), decodes_on_device=cls._decodes_on_device(run),
        ) + (run.threads.numerics_changes() if run.threads is not None else [])

    def _base_summary(self, run: Run) -> dict[str, Any]:
        cfg = run.cfg
        return {
            "schema_version": SCHEMA_VERSION,
            "run": {
                "model": cfg.model.name, "model_size": cfg.model.size, "data": cfg.data.name,
                "accel": cfg.accel.name, "bench": self.mode, "dist": cfg.dist.name,
                "machine_profile": cfg.machine.name, "seed": cfg.seed,
                "started": dt.datetime.fromtimestamp(run.started).isoformat(timespec="seconds"),
                "command": " ".join(redact_argv(sys.argv)),
                "status": RUNNING,
                "output_dir": str(run.output_dir),
            },
            "machine": {**run.machine.to_dict(), "run_dir_filesystem": filesystem_of(run.output_dir)},
            "settings": {
                "accel": run.accel.to_dict(),
                "numerics_changed_by": self._numerics_changes(run),
                # the report tells runs decoded on the GPU before the decode took a stream of its own
                **({"device_decode": DEVICE_DECODE} if run.accel.decodes_jpegs(self._decodes_on_device(run)) else {}),
                "cuda_graphs": {"status": run.cuda_graphs},
                "fused_optimizer": run.fused_optimizer,
                "shape_profile": run.shape_profile,
                "activation_checkpointing": run.activation_checkpointing,
                "threads": run.threads.to_dict() if run.threads is not None else None,
                "compiled_units": run.compiled_units or (
                    "none: the model declares no compile units" if run.accel.compile else []),
                "batch_size": cfg.model.batch_size,
                "global_batch_size": cfg.model.batch_size * _world(run),
                "warmup_steps": self.warmup_steps,
                "steps": self.steps,
                "sync_each_step": self.sync_each_step,
                "profile_steps": self.profile,
                "parameters": sum(p.numel() for p in run.module.net.parameters()),
                "trainable_parameters": sum(p.numel() for p in run.module.net.parameters() if p.requires_grad),
            },
            "targets": self.targets,
            # a named sweep's own keys as this job used them (+experiment=scaling: the batch rule)
            **({"experiment": OmegaConf.to_container(cfg.experiment, resolve=True)}
               if cfg.get("experiment") is not None else {}),
            "memory": {},
            "config": redact(OmegaConf.to_container(cfg, resolve=True)),
            "paths": {"output_dir": str(run.output_dir)},
        }


def _skip_counts(dataset: Any) -> dict[str, int] | None:
    """Samples a dataset skipped (``data.on_corrupt=skip``) in this process and its loader workers; None for
    a dataset that never skips."""
    counts = getattr(dataset, "skip_counts", None)
    return counts() if callable(counts) else None


def _world(run: Run) -> int:
    kwargs = run.trainer_kwargs()
    devices = kwargs["devices"]
    return (devices if isinstance(devices, int) else len(devices)) * int(kwargs["num_nodes"])


class AutotuneBench(TrainBench):
    """Only the trial of ``accel=auto`` (``drivebench.bench.autotune``): its table, no training."""

    runs_training = False
    runs_ceiling = False
    tunes_accel = True  # drivebench.app runs the trial before building the run


class CeilingBench(TrainBench):
    """Only the ceiling phase."""

    runs_training = False
    runs_ceiling = True


class LoaderBench(TrainBench):
    """Only the loader: batches/s of the data pipeline (incl. the copy to the device on GPUs)."""

    runs_training = False
    runs_ceiling = False
    runs_loader = True


def _adopt_live_knobs(run: Run, live: dict[str, Any]) -> None:
    """``accel=auto``'s live knobs as its trial on the run's own steps chose them: the settings of the phases
    after training (the ceiling's and validation's Trainers take precision and cuDNN autotuning from
    ``run.accel``) and of the summary."""
    from drivebench.accel.in_run_trial import SETTINGS_KNOBS

    fields = {k: v for k, v in live.items() if k in SETTINGS_KNOBS}
    if fields:
        run.accel = dataclasses.replace(run.accel, **fields)
    if "fused_optimizer" in fields:
        run.fused_optimizer = "on" if fields["fused_optimizer"] else "off"
    value = fields.get("activation_checkpointing")
    if value is not None and value != run.activation_checkpointing.get("knob"):  # switched on the run's steps
        run.activation_checkpointing = {**run.activation_checkpointing, "knob": value, "enabled": value == "keep",
                                        "reason": f"accel=auto: {value}, timed on the run's own steps (autotune.trials)"}
