"""Compose a run from the resolved config: machine, accel knobs, data, model, logger, callbacks.

The entry point (``__main__``) only calls :func:`main`; benchmarks (``drivebench.bench``) receive
the assembled :class:`Run` and decide what to execute. Every bad value is caught here, before any
data is generated or any step is taken.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import sys
import tempfile
import warnings
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError

from drivebench.accel.compile import apply_compile, shape_profile_key, to_channels_last, use_compile_cache
from drivebench.accel.cuda_graphs import settle_cuda_graphs
from drivebench.accel.settings import AccelSettings
from drivebench.accel.threads import ThreadBudget
from drivebench.ckpt.store import CheckpointWriteError
from drivebench.data.datamodule import DriveDataModule
from drivebench.data.device_transfer import DeviceTransform
from drivebench.data.streaming import check_streams
from drivebench.dist import (DistJob, RankFailed, TooFewDevices, apply_p2p, build_strategy, patch_rank_launch_command,
                             resolve_devices)
from drivebench.errors import ConfigError, DataError, data_error_in_worker
from drivebench.lit.base import DriveModule
from drivebench.models.common.backbone import frozen_norm
from drivebench.models.registry import get_spec
from drivebench.perf.machine import MachineInfo, detect_machine
from drivebench.scaling import apply_batch, skips_unavailable_devices, write_skipped
from drivebench.schemas import check as check_schemas
from drivebench.secrets import redact, redact_text, scrub_hydra_dir, secret_values
from drivebench.signals import STOP, Interrupted

log = logging.getLogger("drivebench")


@dataclass
class Run:
    """Everything one run needs, built once."""

    cfg: DictConfig
    machine: MachineInfo
    accel: AccelSettings
    output_dir: Path
    datamodule: DriveDataModule
    module: DriveModule
    compiled_units: list[str]
    p2p: dict[str, Any] = field(default_factory=dict)
    cuda_graphs: str = "off"  # on | off | off: <why auto turned them off>
    fused_optimizer: str = "off"  # on | off | off: <why it cannot run here> (settings.fused_optimizer)
    shape_profile: str = "off"  # on | off | off: <why auto turned it off> (settings.shape_profile)
    activation_checkpointing: dict[str, Any] = field(default_factory=dict)  # accel's decision, for the summary
    threads: ThreadBudget | None = None  # accel.threads as applied in this process (settings.threads)
    job: DistJob | None = None
    started: float = field(default_factory=time.time)
    autotune: dict[str, Any] | None = None  # accel=auto / bench=autotune: the trial table (summary ``autotune``)

    def logger(self) -> Any:
        return instantiate(self.cfg.logger) if self.cfg.get("logger") else False

    def trainer_kwargs(self) -> dict[str, Any]:
        """Lightning Trainer arguments shared by every phase (device, precision, strategy)."""
        dist = self.cfg.dist
        accelerator = "gpu" if self.machine.accelerator == "cuda" else "cpu"
        return {
            "accelerator": accelerator,
            "devices": resolve_devices(dist, len(self.machine.gpus), accelerator),
            "num_nodes": dist.num_nodes,
            "strategy": build_strategy(dist, accelerator),
            "precision": self.accel.precision,
            "benchmark": self.accel.cudnn_benchmark,
            "default_root_dir": str(self.output_dir),
            "num_sanity_val_steps": 0,
            "use_distributed_sampler": False,  # the datamodule's samplers split ranks and resume
            "enable_model_summary": False,
        }


def build(node: Any, *args: Any, **kwargs: Any) -> Any:
    """``hydra.utils.instantiate``, but a ConfigError raised by the target reaches the user as itself
    (Hydra would wrap it in an InstantiationException with a stack of its own)."""
    try:
        return instantiate(node, *args, **kwargs)
    except InstantiationException as err:
        cause = err.__cause__
        while cause is not None and not isinstance(cause, ConfigError):
            cause = cause.__cause__
        if isinstance(cause, ConfigError):
            raise cause from None
        raise


def _check_positive(cfg: DictConfig, key: str) -> None:
    value = OmegaConf.select(cfg, key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{key}={value!r} is not valid; use a whole number >= 1")


def validate(cfg: DictConfig) -> None:
    """Checks that need no machine: names, sizes, counts (key names and types: the schemas, as Hydra
    composes). A deprecated size name is replaced by its current one (``model.size=tiny`` -> ``test``
    for QCNet), so everything after sees one name. A ConfigError raised by a resolver (``${pick:...}``)
    reaches the user as itself."""
    try:
        _validate(cfg)
    except InterpolationResolutionError as err:
        marker = "ConfigError raised while resolving interpolation: "
        if marker not in str(err):
            raise
        raise ConfigError(str(err).split(marker, 1)[1].splitlines()[0]) from None


def _validate(cfg: DictConfig) -> None:
    try:
        cfg.model.size = get_spec(cfg.model.name).resolve_size(cfg.model.size)
    except ValueError as err:
        raise ConfigError(str(err)) from err
    _check_positive(cfg, "model.batch_size")
    _check_positive(cfg, "model.val_batch_size")
    OmegaConf.to_container(cfg.model, resolve=True)  # every ${pick:...} of the model (its recipe), used or not yet
    check_schemas(cfg)  # what Hydra's composition lets through: keys added with +, auto-or-number knobs
    apply_batch(cfg)  # experiment.batch=global: this job's share of the global batch (drivebench.scaling)
    if OmegaConf.select(cfg, "callbacks.step_timer") is None:
        raise ConfigError("callbacks.step_timer=null is not valid: the step timer is the benchmark's clock "
                          "(every figure of summary.json comes from it); remove other callbacks, not this one")
    if not isinstance(cfg.seed, int):
        raise ConfigError(f"seed={cfg.seed!r} is not valid; use a whole number")
    requeue = cfg.get("requeue", False)
    if not isinstance(requeue, bool):
        raise ConfigError(f"requeue={requeue!r} is not valid; use true or false")
    if requeue and cfg.get("resume") != "auto":
        raise ConfigError(f"requeue=true restarts this command after a SIGUSR1 stop, which then continues only with "
                          f"resume=auto (resume={cfg.get('resume')}); add resume=auto")
    growth = OmegaConf.select(cfg, "model.module.bucket_growth")  # QCNet's shape buckets (accel.cuda_graphs)
    if growth is not None and (isinstance(growth, bool) or not isinstance(growth, (int, float)) or growth < 1):
        raise ConfigError(f"model.module.bucket_growth={growth!r} is not valid; use a factor >= 1 (default 1.15)")
    if OmegaConf.select(cfg, "model.module.max_buckets") is not None:
        _check_positive(cfg, "model.module.max_buckets")
    norm_eval = OmegaConf.select(cfg, "model.net.norm_eval")
    if norm_eval is not None:
        try:
            frozen_norm(norm_eval, weights=None)
        except ValueError as err:
            raise ConfigError(f"model.net.{err}") from None
    lr = OmegaConf.select(cfg, "model.optimizer.lr")
    if lr is not None and (isinstance(lr, bool) or not isinstance(lr, (int, float)) or lr < 0):
        raise ConfigError(f"model.optimizer.lr={lr!r} is not valid; use a learning rate >= 0")


# paths that must be (or become) directories: naming a file would fail where the run first writes there
_DIRECTORIES = ("hydra.run.dir", "hydra.sweep.dir", "paths.cache", "paths.outputs_root", "ckpt.dir")


def _check_streaming_batch(cfg: DictConfig, source: Any, processes: int) -> None:
    """A streaming batch sampler (SparseDrive) gives every batch slot of every rank its own driving
    sequence: refuse a batch the embedded set's sequences cannot feed (a real root is checked once its
    infos are loaded, by the sampler itself)."""
    if cfg.model.get("batch_sampler") and hasattr(source, "known_sequences"):
        check_streams(cfg.model.batch_size, processes * int(cfg.dist.num_nodes), source.known_sequences("train"),
                      split=f"training split of data.size={cfg.data.size}")


def check_before_start(cfg: DictConfig) -> None:
    """Every check a run makes of its config before any work, made before Hydra starts the job (the
    ``drivebench`` command runs it on each job it composed, with ``return_hydra_config``): the values
    (:func:`validate`), the bench's and the data source's arguments, the accel knobs and the devices
    against this machine (the fused optimizer with clipping too), the directories, a local ``resume=<path>``. ConfigError (one line) for the first
    that fails; builds nothing that stays."""
    from drivebench.ckpt.resume import read_checkpoint

    validate(cfg)
    build(cfg.bench)
    _check_directories(cfg)
    source = build(cfg.data.source)
    machine = detect_machine(cfg.machine.accelerator)
    accelerator = "gpu" if machine.accelerator == "cuda" else "cpu"
    try:
        processes = resolve_devices(cfg.dist, len(machine.gpus), accelerator)
    except TooFewDevices:
        if not skips_unavailable_devices(cfg):
            raise
        return  # the job records itself as skipped when it starts (drivebench.scaling): nothing else of it runs
    _check_streaming_batch(cfg, source, processes)
    accel_cfg = OmegaConf.to_container(cfg.accel, resolve=True)
    accel = AccelSettings.resolve(accel_cfg, machine, processes)
    accel.thread_budget(accel_cfg["threads"], machine, processes)
    accel.settle_fused_optimizer(accel_cfg["fused_optimizer"], OmegaConf.select(cfg, "trainer.gradient_clip_val"))
    if cfg.dist.strategy == "ddp":
        apply_p2p(cfg.dist.get("p2p", "auto"), cache_dir=cfg.paths.cache, environ={})
        build_strategy(cfg.dist, accelerator)
    resume = cfg.get("resume")
    if resume not in (None, "", "none", "auto") and "://" not in str(resume):
        if not Path(str(resume)).expanduser().is_file():
            raise ConfigError(f"resume={resume} does not exist (or is not a file); give a step-*.ckpt file that a "
                              "drivebench run wrote, or resume=auto")
        read_checkpoint(str(Path(str(resume)).expanduser()))  # memory-mapped: its pickle only
    _check_backbone_weights(cfg)
    _check_net_arguments(cfg)


_ARGUMENT_ERROR = re.compile(r"(\w+)=")


def _check_net_arguments(cfg: DictConfig) -> None:
    """The net's constructor, run on the meta device (no memory, no data), so that a bad choice among its
    arguments (``model.net.compile_scope=all``) is refused in one line before any work. A ValueError that names one
    of ``model.net``'s keys (``compile_scope='all' is not valid; ...``) becomes a ConfigError for that key; any
    other failure there (a constructor that copies data, which meta tensors cannot give) is left to the real build."""
    import torch

    keys = {str(k) for k in cfg.model.net.keys() if not str(k).startswith("_")}
    try:
        # silent: loading weights into meta parameters warns once per tensor (a no-op copy); the real build warns
        # whatever is worth a warning
        with torch.device("meta"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            build(cfg.model.net)
    except ConfigError:
        raise
    except Exception as err:  # noqa: BLE001 - only a ValueError naming a key is the config's fault
        cause: BaseException | None = err
        while cause is not None and not isinstance(cause, ValueError):
            cause = cause.__cause__
        named = _ARGUMENT_ERROR.match(str(cause)) if cause is not None else None
        if named and named.group(1) in keys:
            raise ConfigError(f"model.net.{cause}") from None


def _check_backbone_weights(cfg: DictConfig) -> None:
    weights = OmegaConf.select(cfg, "model.net.backbone_weights")
    if weights not in (None, "") and not Path(str(weights)).expanduser().is_file():
        raise ConfigError(f"model.net.backbone_weights={weights} does not exist (or is not a file); give a torchvision "
                          "ResNet state_dict file, or model.net.backbone_weights=null to train from random init")


def _check_directories(cfg: DictConfig) -> None:
    for key in _DIRECTORIES:
        try:
            value = OmegaConf.select(cfg, key, throw_on_resolution_failure=True)
        except InterpolationResolutionError:  # ${hydra:runtime.output_dir}: inside hydra.run.dir, checked
            continue
        if value is None or "://" in str(value):
            continue
        path = Path(str(value)).expanduser()
        for part in (path, *path.parents):
            if part.exists():
                if not part.is_dir():
                    what = "names a file" if part == path else f"is inside {part}, a file"
                    raise ConfigError(f"{key}={value} {what}; it must be a directory: choose another {key}")
                if not (key == "ckpt.dir" and cfg.bench.get("mode") == "storage"):  # candidates: the bench tries each
                    _check_writable(key, value, part)
                break


def _check_writable(key: str, value: Any, existing: Path) -> None:
    """``existing`` (``value`` itself or its nearest existing parent) takes a new folder: made and removed at once,
    so that a run does not prepare its data and then fail to write there (``ckpt.dir=/proc/x``, a read-only mount)."""
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".drivebench-probe-", dir=existing))
    except OSError as err:
        where = "is not writable" if existing == Path(str(value)).expanduser() else f"cannot be made in {existing}"
        raise ConfigError(f"{key}={value} {where} ({err.strerror or err}); choose a writable {key}") from None


def build_run(cfg: DictConfig, output_dir: Path, progress: bool = True) -> Run:
    validate(cfg)
    p2p = apply_p2p(cfg.dist.get("p2p", "auto"), cache_dir=cfg.paths.cache) if cfg.dist.strategy == "ddp" else {}
    machine = detect_machine(cfg.machine.accelerator)
    if cfg.machine.accelerator == "gpu" and machine.accelerator != "cuda":
        log.warning("machine=%s describes a GPU machine but this one has no usable GPU: the run goes on here on "
                    "the CPU (the profile is for dispatching jobs to that machine: hydra/launcher=drivebench_slurm)",
                    cfg.machine.name)
    accel_cfg = OmegaConf.to_container(cfg.accel, resolve=True)
    # training processes on this node share its cores (the trainer checks dist.devices again below)
    processes = resolve_devices(cfg.dist, len(machine.gpus), "gpu" if machine.accelerator == "cuda" else "cpu")
    accel = AccelSettings.resolve(accel_cfg, machine, processes)
    accel.apply_global_flags()
    # before data preparation: its process pool and the loader workers start within the budget
    threads = accel.thread_budget(accel_cfg["threads"], machine, processes).apply()
    if threads.to_dict()["fits"] is False:
        log.warning("accel.threads: %s", threads.note())
    pl.seed_everything(cfg.seed, workers=True, verbose=False)

    source = build(cfg.data.source)
    transform = build(cfg.model.transform) if cfg.model.get("transform") else None
    collate = build(cfg.model.collate) if cfg.model.get("collate") else None
    batch_sampler = build(cfg.model.batch_sampler) if cfg.model.get("batch_sampler") else None
    _check_streaming_batch(cfg, source, processes)  # before any data work
    net = build(cfg.model.net)
    checkpointing = accel.apply_activation_checkpointing(net, machine, cfg.model.batch_size)  # before compile
    if accel.channels_last:
        to_channels_last(net)
    accel.compile_cache = use_compile_cache(accel.compile_cache, cfg.paths.cache)  # before anything compiles
    shape_profile = accel.settle_shape_profile(accel_cfg["compile_shape_profile"], net)
    profile = (shape_profile_key(OmegaConf.to_container(cfg.model, resolve=True), accel)
               if shape_profile == "on" else None)  # only runs that use it resolve the model
    compiled = apply_compile(net, accel, profile)
    device_transform = _device_transform(transform, net, accel)
    if device_transform is not None and getattr(device_transform, "compiles", False):
        compiled.append("device_transform")
    datamodule = DriveDataModule(
        source=source, transform=transform, collate_fn=collate, batch_size=cfg.model.batch_size,
        val_batch_size=cfg.model.val_batch_size, accel=accel, seed=cfg.seed,
        train_split=cfg.data.train_split, val_split=cfg.data.val_split, progress=progress,
        batch_sampler=batch_sampler, device_transform=device_transform, threads=threads,
    )
    scheduler = build(cfg.model.scheduler) if cfg.model.get("scheduler") else None
    module = build(cfg.model.module)(
        net=net, optimizer=build(cfg.model.optimizer), scheduler=scheduler,
        scheduler_interval=cfg.model.get("scheduler_interval", "step"),
    )
    module.run_config = redact(_plain_config(cfg))
    run = Run(cfg=cfg, machine=machine, accel=accel, output_dir=output_dir, datamodule=datamodule,
              module=module, compiled_units=compiled, p2p=p2p, activation_checkpointing=checkpointing,
              threads=threads, shape_profile=shape_profile)
    kwargs = run.trainer_kwargs()  # validates dist.devices / backend against this machine before any work
    devices = kwargs["devices"]
    world = (devices if isinstance(devices, int) else len(devices)) * int(kwargs["num_nodes"])
    try:
        graphs, run.cuda_graphs = settle_cuda_graphs(accel.cuda_graphs, module.supports_static_shapes, world,
                                                     int(cfg.trainer.accumulate_grad_batches))
    except ValueError as err:
        raise ConfigError(str(err)) from err
    accel.cuda_graphs = "on" if graphs else "off"
    run.fused_optimizer = accel.settle_fused_optimizer(accel_cfg["fused_optimizer"],
                                                       OmegaConf.select(cfg, "trainer.gradient_clip_val"))
    module.fused_optimizer = accel.fused_optimizer
    if graphs:
        module.enable_cuda_graphs()
    return run


def _device_transform(transform: Any, net: Any, accel: AccelSettings) -> DeviceTransform | None:
    """What the datamodule runs on each batch once it is on the device: the device half of a camera
    pipeline (``accel.device_transform``), or a model's own batch preprocessing (mmdet3d's
    data_preprocessor, ``net.device_transform``)."""
    if hasattr(transform, "device_transform_for"):
        return transform.device_transform_for(accel)
    return getattr(net, "device_transform", None)


def _plain_config(cfg: DictConfig) -> dict[str, Any]:
    """The config as plain data, resolved where it can be (outside a Hydra run, ``${hydra:...}``
    cannot be: then the interpolations stay as written)."""
    try:
        return OmegaConf.to_container(cfg, resolve=True)
    except InterpolationResolutionError:
        return OmegaConf.to_container(cfg, resolve=False)


def _drop_attempt_logs(log_dir: str | None, output_dir: Path) -> None:
    """The TensorBoard files of a run attempt that ``accel=auto`` stopped after its first steps to try loader
    settings: the attempt that follows logs from step 0 again into the same directory."""
    if not log_dir:
        return
    path = Path(log_dir).resolve()
    if path.is_dir() and path.is_relative_to(output_dir.resolve()) and path != output_dir.resolve():
        for events in path.rglob("events.out.tfevents.*"):
            events.unlink()


def quiet_third_party_noise() -> None:
    """Silence messages about choices drivebench makes on purpose and Lightning's banners; our
    summary says what ran where."""
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)")
    warnings.filterwarnings("ignore", message=r".*smaller than the logging interval")
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        logging.getLogger(name).setLevel(logging.WARNING)


def main(cfg: DictConfig) -> dict[str, Any]:
    """Build the run, execute the configured benchmark, return its summary."""
    quiet_third_party_noise()
    from hydra.core.hydra_config import HydraConfig

    output_dir = Path(HydraConfig.get().runtime.output_dir) if HydraConfig.initialized() else Path(cfg.paths.output_dir)
    scrub_hydra_dir(output_dir)  # Hydra saved the raw config: take credentials out of it
    patch_rank_launch_command()
    STOP.install()  # SIGTERM / SIGINT / SIGUSR1: stop at a step boundary, checkpoint, summary, exit 128 + signal
    try:
        with DistJob() as job:
            STOP.forward_to.append(job.rank_processes)
            bench = build(cfg.bench)  # first: its arguments are checked before the run is built
            started = time.time()
            if not (cfg.accel.get("auto_trial") or getattr(bench, "tunes_accel", False)):
                run = build_run(cfg, output_dir)
                run.job = job
                return bench.run(run)
            from drivebench.accel.in_run_trial import RetuneBeforeRun
            from drivebench.bench.autotune import AccelTrial, with_accel  # imports the benches, which import us

            trial = AccelTrial(cfg, output_dir, build_run, judge_in_run=not getattr(bench, "tunes_accel", False),
                               live_in_run=not OmegaConf.select(cfg, "bench.profile"))
            retune = None
            while True:
                tuned = trial.run(retune=retune)  # times the candidates, prints the table
                run = build_run(with_accel(cfg, trial.chosen), output_dir)
                run.job = job
                run.autotune, run.started = tuned, started  # the run's wall time includes its trial
                attempt = time.monotonic()
                try:
                    return bench.run(run)
                except RetuneBeforeRun as again:  # the loader bounds the run's first steps: its knobs need trials
                    if retune is not None:  # after the loader's trials nothing is gated: cannot happen twice
                        raise
                    print(f"accel trial: {again.reason}; the run starts again after them", flush=True)
                    again.spent_s = time.monotonic() - attempt  # the whole attempt: built, started, its steps
                    _drop_attempt_logs(again.log_dir, output_dir)
                    del run
                    retune = again
    except Interrupted as stop:
        _exit_interrupted(stop)
    except KeyboardInterrupt:  # SIGINT before the handler was installed, or from a library's own handler
        _exit_interrupted(Interrupted(signal.SIGINT))
    except SIGTERMException:  # Lightning's SIGTERM handling, if it ever runs before ours (a SystemExit)
        _exit_interrupted(Interrupted(signal.SIGTERM))
    except TooFewDevices as err:
        if not skips_unavailable_devices(cfg):
            print(f"drivebench: error: {err}", file=sys.stderr)
            sys.exit(2)
        return write_skipped(cfg, output_dir, str(err).split(";")[0])  # the sweep goes on with its next job
    except (ConfigError, DataError) as err:
        print(f"drivebench: error: {err}", file=sys.stderr)
        sys.exit(2)
    except CheckpointWriteError as err:
        # storage failed mid-run: one line, like a ConfigError (Hydra, handed the exception, would also
        # print the raw command-line overrides, credentials included)
        print(f"drivebench: error: {err}", file=sys.stderr)
        sys.exit(1)
    except RankFailed as err:  # another rank died: its name is the message (the collective that noticed is not)
        if logging.getLogger().handlers:  # the run's log (a rank process Lightning launched has none)
            log.error("run failed: %s", err)
        print(f"drivebench: error: {err}", file=sys.stderr)
        sys.exit(1)
    except Exception as err:  # a bug or an environment failure: full traceback to the run's log only
        secrets = secret_values(OmegaConf.select(cfg, "ckpt.storage_options"))
        bad_data = data_error_in_worker(err)
        if bad_data is not None:  # a DataError raised in a loader worker: torch re-raises it as text
            log.error("run failed: %s", redact_text(bad_data, secrets))  # the worker's traceback is noise here
            print(f"drivebench: error: {redact_text(bad_data, secrets)}", file=sys.stderr)
            sys.exit(2)
        log.exception("run failed")
        where = output_dir / "__main__.log"
        print(f"drivebench: error: {type(err).__name__}: {redact_text(str(err), secrets)[:2000]}\n"
              f"  (full traceback in {where}; set HYDRA_FULL_ERROR=1 to also raise it here)", file=sys.stderr)
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        sys.exit(1)
    finally:
        STOP.forward_to.clear()
        STOP.restore()


def _exit_interrupted(stop: Interrupted) -> None:
    """One line (global rank 0 only: every rank stops), then exit with 128 + the signal's number."""
    from lightning.pytorch.utilities.rank_zero import rank_zero_only

    if getattr(rank_zero_only, "rank", 0) == 0:
        print(stop.line(), file=sys.stderr, flush=True)
    sys.exit(stop.exit_code)
