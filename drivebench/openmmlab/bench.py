"""``bench=mmengine``: the model's mmdet3d config run by mmengine's own Runner, timed per iteration.

Why: the fairest speed comparison drivebench can make is the same mmdet3d model and data under
mmengine's runner and under drivebench. The runner trains ``bench.warmup_steps + bench.steps``
iterations (IterBasedTrainLoop, no validation, no checkpoints); a hook records each iteration in
drivebench's :class:`~drivebench.perf.callback.StepRecord` terms and the summary is written in the
same schema as ``bench=train`` (``run.bench = "mmengine"``, ``run.runner = "mmengine"``), so
``python -m drivebench.report`` lists both runners side by side.

What each iteration is split into (host clock): data wait = time blocked in the loader's
``next()``; preprocess = the model's data_preprocessor (reported as ``gpu_preprocess``, as
drivebench reports it); compute = the rest of ``train_step`` and the iteration hooks; loop overhead =
the rest of the gap between iterations. With ``apply_accel`` the accel knobs that mmengine's config
has an equivalent for are mapped onto the runner (loader knobs, AMP, cudnn.benchmark, compile); the
ones it has not (shared-memory cache, gc_freeze, channels-last, device prefetch) are listed as
``drivebench_only`` in ``settings.mmengine``.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from drivebench.app import Run
from drivebench.bench.phase_logger import FIT, phase_logger
from drivebench.bench.runners import TrainBench
from drivebench.data.epoch_stream import stop_workers
from drivebench.errors import ConfigError
from drivebench.openmmlab.configs import load_config
from drivebench.perf.callback import PhaseTimes, StepRecord
from drivebench.perf.summary import loss_summary, phase_stats
from drivebench.perf.system import SystemMonitor

AMP_DTYPES = {"bf16-mixed": "bfloat16", "16-mixed": "float16"}
DRIVEBENCH_ONLY = ("shm_cache", "gc_freeze", "channels_last", "device_prefetch", "device_transform")


class _TimedIterator:
    """Wraps the loop's dataloader iterator: the host time blocked in ``next()`` per iteration."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.last_s = 0.0

    def __iter__(self) -> "_TimedIterator":
        return self

    def __next__(self) -> Any:
        t0 = time.perf_counter()
        try:
            return next(self.inner)
        finally:
            self.last_s = time.perf_counter() - t0


def make_timing_hook(warmup_steps: int, monitor: SystemMonitor | None, logger: Any, log_every: int) -> Any:
    """An mmengine Hook that turns every training iteration into a :class:`StepRecord`."""
    from mmengine.hooks import Hook

    class IterationTimes(Hook):
        priority = "LOWEST"  # after_train_iter runs last: the iteration's end includes every other hook

        def __init__(self) -> None:
            self.times = PhaseTimes("train")
            self._iter_wrapper: _TimedIterator | None = None
            self._t_prev_end = 0.0
            self._t_start = 0.0
            self._pre_s = 0.0
            self._t_pre = 0.0
            self._cuda = False

        def before_train(self, runner: Any) -> None:
            loop = runner.train_loop
            if hasattr(loop, "dataloader_iterator"):
                self._iter_wrapper = _TimedIterator(loop.dataloader_iterator)
                loop.dataloader_iterator = self._iter_wrapper
            model = _unwrap(runner.model)
            self._cuda = any(p.is_cuda for p in model.parameters())
            pre = model.data_preprocessor
            pre.register_forward_pre_hook(self._pre_start)
            pre.register_forward_hook(self._pre_end)
            if monitor is not None:
                monitor.start()
            self.times.started = self._t_prev_end = time.perf_counter()

        def _pre_start(self, *args: Any) -> None:
            self._t_pre = time.perf_counter()

        def _pre_end(self, *args: Any) -> None:
            self._pre_s += time.perf_counter() - self._t_pre

        def before_train_iter(self, runner: Any, batch_idx: int, data_batch: Any = None) -> None:
            self._t_start = time.perf_counter()
            self._pre_s = 0.0

        def after_train_iter(self, runner: Any, batch_idx: int, data_batch: Any = None, outputs: Any = None) -> None:
            if self._cuda:
                torch.cuda.synchronize()  # mmengine reads the loss back every iteration anyway
            t_end = time.perf_counter()
            gap = max(self._t_start - self._t_prev_end, 0.0)
            wait = min(self._iter_wrapper.last_s, gap) if self._iter_wrapper is not None else gap
            loss = (outputs or {}).get("loss")
            n = len(self.times.records)
            record = StepRecord(
                step=n, warmup=n < warmup_steps, samples=_samples(data_batch), step_s=t_end - self._t_prev_end,
                data_wait_s=wait, h2d_s=0.0, gpu_preprocess_s=self._pre_s,
                compute_s=t_end - self._t_start - self._pre_s, loop_overhead_s=gap - wait,
                loss=float(loss.detach() if isinstance(loss, torch.Tensor) else loss) if loss is not None else None,
            )
            if n == warmup_steps:
                self.times.measured_started = self._t_prev_end
            self.times.records.append(record)
            self._t_prev_end = t_end
            if logger and n % log_every == 0:
                logger.log_metrics({
                    "perf/step_time_s": record.step_s, "perf/data_wait_s": record.data_wait_s,
                    "perf/gpu_preprocess_s": record.gpu_preprocess_s, "perf/compute_s": record.compute_s,
                    "perf/loop_overhead_s": record.loop_overhead_s,
                    "perf/samples_per_s": record.samples / record.step_s if record.step_s > 0 else 0.0,
                    **({"train/loss": record.loss} if record.loss is not None else {}),
                }, step=n)

        def after_train(self, runner: Any) -> None:
            self.times.ended = time.perf_counter()

    return IterationTimes()


def _unwrap(model: Any) -> Any:
    from mmengine.model import is_model_wrapper

    return model.module if is_model_wrapper(model) else model


def _samples(data_batch: Any) -> int:
    if isinstance(data_batch, dict) and "data_samples" in data_batch:
        return len(data_batch["data_samples"])
    return 1


class MMEngineBench(TrainBench):
    """Args: those of :class:`TrainBench` (steps, warm-up...), plus ``apply_accel`` (map the accel
    knobs mmengine has onto its runner) and ``log_interval`` (mmengine's own LoggerHook)."""

    runs_ceiling = False

    def __init__(self, apply_accel: bool = True, log_interval: int = 10, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.apply_accel = apply_accel
        self.log_interval = log_interval
        self.mapping: dict[str, Any] = {}

    def run(self, run: Run) -> dict[str, Any]:
        if run.cfg.model.name != "mmdet3d" or not hasattr(run.datamodule.source, "dataset_cfg"):
            raise ConfigError(f"bench=mmengine runs an mmdet3d config with mmengine's runner; use it with "
                              f"model=mmdet3d (got model={run.cfg.model.name})")
        if run.cfg.dist.strategy == "ddp":
            raise ConfigError("bench=mmengine runs one process (mmengine launcher 'none'); use dist=single")
        return super().run(run)

    def _base_summary(self, run: Run) -> dict[str, Any]:
        summary = super()._base_summary(run)
        summary["run"]["runner"] = "mmengine"
        summary["run"]["compare_as"] = "train"  # the report puts it beside bench=train runs of the same model
        summary["settings"]["compiled_units"] = []
        return summary

    def runner_config(self, run: Run) -> Any:
        """The mmengine Config the Runner gets: the model's config, drivebench's data and batch size,
        the iteration loop, and the mapped accel knobs (recorded in ``self.mapping``)."""
        source = run.datamodule.source
        cfg = load_config(source.config, source.preset, source.cfg_options)
        cfg.pop("_drivebench", None)
        accel = run.accel
        loader: dict[str, Any] = {
            "batch_size": run.cfg.model.batch_size, "drop_last": True,
            # mmengine's advice for iteration loops: a finite sampler restarts the loader every epoch
            # with a 2 s sleep in _InfiniteDataloaderIterator (mmengine 0.10), which would dominate here
            "sampler": {"type": "InfiniteSampler", "shuffle": True, "seed": run.cfg.seed},
            "collate_fn": {"type": "pseudo_collate"},
            "dataset": source.dataset_cfg(run.cfg.data.train_split, train=True),
        }
        own = cfg.train_dataloader
        if self.apply_accel:
            loader.update(accel.loader_kwargs())
        else:
            loader.update({k: own[k] for k in ("num_workers", "persistent_workers", "pin_memory", "prefetch_factor")
                           if k in own})
        if not loader.get("num_workers"):
            loader["persistent_workers"] = False
            loader.pop("prefetch_factor", None)
        cfg.train_dataloader = loader
        total = self.warmup_steps + self.steps
        cfg.train_cfg = {"type": "IterBasedTrainLoop", "max_iters": total, "val_interval": total + 1}
        for key in ("val_dataloader", "val_cfg", "val_evaluator", "test_dataloader", "test_cfg", "test_evaluator"):
            cfg[key] = None
        cfg.default_hooks = {**dict(cfg.get("default_hooks") or {}), "checkpoint": None,
                             "logger": {"type": "LoggerHook", "interval": self.log_interval}}
        cfg.log_processor = {**dict(cfg.get("log_processor") or {}), "by_epoch": False}
        if cfg.get("visualizer"):
            cfg.visualizer = {k: v for k, v in cfg.visualizer.items() if k != "name"}  # one per run
        cfg.work_dir = str(run.output_dir / "mmengine")
        cfg.launcher = "none"
        cfg.randomness = {"seed": run.cfg.seed}
        cfg.load_from, cfg.resume = None, False
        wrapper = dict(cfg.optim_wrapper)
        env = dict(cfg.get("env_cfg") or {})
        mapped: dict[str, Any] = {"train_dataloader": {k: loader.get(k) for k in
                                                       ("batch_size", "num_workers", "persistent_workers",
                                                        "pin_memory", "prefetch_factor")},
                                  "sampler": "InfiniteSampler"}
        if self.apply_accel:
            if accel.precision in AMP_DTYPES:
                wrapper.update(type="AmpOptimWrapper", dtype=AMP_DTYPES[accel.precision])
            elif accel.precision.startswith("32"):
                wrapper["type"] = "OptimWrapper"
                wrapper.pop("loss_scale", None)
                wrapper.pop("dtype", None)
            else:
                raise ConfigError(f"bench=mmengine: accel.precision={accel.precision} has no mmengine equivalent; "
                                  "use 32-true, bf16-mixed or 16-mixed")
            env["cudnn_benchmark"] = accel.cudnn_benchmark
            # as drivebench does: compile only where the model's compile_scope asks for it (PointPillars
            # on the H200: mmengine's whole-train_step compile was still compiling after 180 s)
            compile_now = bool(accel.compile) and run.cfg.model.net.get("compile_scope", "none") != "none"
            if compile_now:
                cfg.compile = True  # mmengine compiles the whole train_step
            mapped.update(optim_wrapper=wrapper["type"], amp_dtype=wrapper.get("dtype"),
                          cudnn_benchmark=accel.cudnn_benchmark,
                          compile="train_step (whole)" if compile_now else False,
                          tf32=accel.tf32, drivebench_only={k: getattr(accel, k) for k in DRIVEBENCH_ONLY})
        else:
            mapped.update(optim_wrapper=wrapper.get("type", "OptimWrapper"), note="the config's own settings")
        cfg.optim_wrapper = wrapper
        cfg.env_cfg = env
        self.mapping = mapped
        return cfg

    def _train_phase(self, run: Run, logger: Any, monitor: SystemMonitor, summary: dict[str, Any]) -> int:
        """Train under mmengine's runner; fill ``summary``; return the iterations run."""
        from mmengine.runner import Runner

        from drivebench.openmmlab.amp import patch_float32_only

        cfg = self.runner_config(run)
        self.mapping["float32_only_wrapped"] = patch_float32_only()  # as under drivebench (register_mmdet3d)
        hook = make_timing_hook(self.warmup_steps, monitor, phase_logger(logger, FIT), run.cfg.trainer.log_every_n_steps)
        runner = Runner.from_cfg(cfg)
        runner.register_hook(hook)
        if run.machine.accelerator == "cuda":
            torch.cuda.reset_peak_memory_stats()
        try:
            runner.train()
        finally:
            loop = getattr(runner, "_train_loop", None)  # a dict until runner.train() built the loop
            if hasattr(loop, "dataloader"):
                stop_workers(loop.dataloader, getattr(getattr(loop, "dataloader_iterator", None), "_iterator", None))
            # the runner's log file stays attached to mmengine's global logger otherwise
            for handler in list(runner.logger.handlers):
                if isinstance(handler, logging.FileHandler):
                    handler.close()
                    runner.logger.removeHandler(handler)
        self.is_global_zero = True
        summary["train"] = phase_stats(hook.times, monitor)
        summary["loss"] = loss_summary(hook.times.records)
        summary["settings"]["mmengine"] = {"work_dir": cfg.work_dir, "iterations": len(hook.times.records),
                                           **self.mapping}
        if run.machine.accelerator == "cuda":
            summary["memory"]["peak_device_gb"] = torch.cuda.max_memory_allocated() / 2**30
            summary["memory"]["peak_device_reserved_gb"] = torch.cuda.max_memory_reserved() / 2**30
        return len(hook.times.records)
