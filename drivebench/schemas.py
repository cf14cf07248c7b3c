"""The typed shape of drivebench's config: one dataclass per config group option, in Hydra's ConfigStore.

Each group option in ``drivebench/conf`` names its schema first in its defaults list (``- /schema_accel``),
so Hydra itself refuses a key the schema does not have (``accel.num_worker=4``) or a value of the wrong
type (``bench.val_batches=abc``) while it composes. The yaml files hold the values and their
documentation; the dataclasses hold the names and types (``MISSING``: the yaml must set it).

OmegaConf 2.3 has no unions, so a knob that takes ``auto`` or a number is typed ``Any`` and checked in
its dataclass's ``__post_init__``, which :func:`check` runs (``OmegaConf.to_object``) right after
composition. :func:`check` also refuses keys appended with ``+`` (``+accel.num_worker=4``), which Hydra
lets into a structured node. Range checks (a negative count...) belong in the same ``__post_init__``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, ClassVar, Dict, List, Optional

from omegaconf import MISSING, DictConfig, OmegaConf

from drivebench.errors import ConfigError


def _whole_or_auto(group: str, obj: Any, *keys: str) -> None:
    """``auto`` or a whole number >= 0, the one rule for every count that a machine can pick."""
    for key in keys:
        value = getattr(obj, key)
        if value == "auto":
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"{group}.{key}={value!r} is not valid; use a whole number >= 0 or 'auto'")


def _at_least(group: str, obj: Any, minimum: int, *keys: str, optional: bool = False) -> None:
    """A whole number >= ``minimum`` (or null where ``optional``): counts, intervals, sizes."""
    for key in keys:
        value = getattr(obj, key)
        if value is None and optional:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            null = " or null" if optional else ""
            raise ConfigError(f"{group}.{key}={value!r} is not valid; use a whole number >= {minimum}{null}")


def _positive(group: str, obj: Any, *keys: str, optional: bool = False, zero: bool = False) -> None:
    """A number > 0 (>= 0 where ``zero``; or null where ``optional``): minutes, seconds, sizes, norms."""
    for key in keys:
        value = getattr(obj, key)
        if value is None and optional:
            continue
        bad = isinstance(value, bool) or not isinstance(value, (int, float)) or (value < 0 if zero else value <= 0)
        if bad:
            null = " or null" if optional else ""
            raise ConfigError(f"{group}.{key}={value!r} is not valid; use a number {'>=' if zero else '>'} 0{null}")


def _one_of(group: str, obj: Any, key: str, choices: tuple[Any, ...]) -> None:
    """One of ``choices``, of the same type (``true`` is no ``1``, ``"true"`` no ``true``)."""
    value = getattr(obj, key)
    if not any(type(c) is type(value) and c == value for c in choices):
        words = ["null" if c is None else str(c).lower() if isinstance(c, bool) else str(c) for c in choices]
        raise ConfigError(f"{group}.{key}={value!r} is not valid; choose one of: {', '.join(words)}")


def resolve_profile(value: Any) -> int:
    """``bench.profile``: steps to profile; 0, null or false = off."""
    if value is None or value is False:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"bench.profile={value!r} is not valid; use a number of steps >= 1, or 0/null (off)")
    return value


def resolve_val_batches(value: Any) -> int | float:
    """``bench.val_batches``: a number of batches (0 = no validation) or ``all`` (Lightning's 1.0)."""
    if value == "all":
        return 1.0
    if value is None or value is False:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"bench.val_batches={value!r} is not valid; use a number of batches >= 0 or 'all'")
    return value


# ---- accel: the speed knobs (conf/accel/none.yaml documents each) -----------------------------------
@dataclass
class AccelConfig:
    """``auto`` is allowed for every count and flag; :class:`drivebench.accel.settings.AccelSettings`
    resolves it against the machine and checks the values."""

    name: str = MISSING
    preprocess_workers: Any = MISSING
    precompute_targets: Any = MISSING
    shm_cache: Any = MISSING
    shm_cache_max_gb: Any = MISSING
    gc_freeze: Any = MISSING
    num_workers: Any = MISSING
    pin_memory: Any = MISSING
    persistent_workers: Any = MISSING
    prefetch_factor: Optional[int] = MISSING
    compile: Any = MISSING
    compile_mode: str = MISSING
    compile_dynamic: Optional[bool] = MISSING
    compile_cache: str = MISSING
    compile_shape_profile: Any = MISSING
    precision: str = MISSING
    tf32: Any = MISSING
    cudnn_benchmark: Any = MISSING
    channels_last: Any = MISSING
    device_transform: Any = MISSING
    device_prefetch: Any = MISSING
    prefetch_across_epochs: Any = MISSING
    fused_optimizer: Any = MISSING
    cuda_graphs: Any = MISSING   # off | on | auto (YAML reads a bare off/on as a boolean)
    activation_checkpointing: str = MISSING  # keep | off | auto
    auto_trial: bool = MISSING           # accel=auto's trial of candidate settings before training
    auto_numerics: bool = MISSING
    auto_budget_s: float = MISSING
    auto_steps: int = MISSING
    auto_warmup_steps: Any = MISSING     # a whole number or auto
    auto_margin: float = MISSING
    auto_in_run: Any = MISSING           # auto | true | false: live knobs timed on the run's own steps
    threads: Any = MISSING               # default | auto | a whole number: the thread budget


# ---- bench: what a run executes (conf/bench/*.yaml) -------------------------------------------------
@dataclass
class TrainBenchConfig:
    """bench=train, ceiling, loader (drivebench.bench.runners)."""

    _target_: str = MISSING
    mode: str = MISSING
    warmup_steps: Any = MISSING
    steps: Any = MISSING
    max_minutes: Optional[float] = MISSING
    val_batches: Any = MISSING   # a number of batches or all
    ceiling: bool = MISSING
    ceiling_warmup_steps: int = MISSING
    ceiling_steps: Any = MISSING
    loader_batches: Any = MISSING
    sync_each_step: bool = MISSING
    profile: Any = MISSING   # steps under torch.profiler: a whole number, or 0 / null / false (off)
    targets: Any = MISSING   # quality targets: a list of METRIC<=VALUE (or one), checked by the bench

    def __post_init__(self) -> None:
        _whole_or_auto("bench", self, "warmup_steps", "steps", "ceiling_steps", "loader_batches")
        resolve_val_batches(self.val_batches)
        _positive("bench", self, "max_minutes", optional=True)
        _at_least("bench", self, 0, "ceiling_warmup_steps")
        resolve_profile(self.profile)


@dataclass
class MMEngineBenchConfig(TrainBenchConfig):
    """bench=mmengine (drivebench.openmmlab.bench)."""

    apply_accel: bool = MISSING
    log_interval: int = MISSING


@dataclass
class StorageBenchConfig:
    """bench=storage (drivebench.bench.storage)."""

    _target_: str = MISSING
    mode: str = MISSING
    dirs: Any = MISSING      # a list, a comma-separated string, or null (= ckpt.dir)
    size_mb: Any = MISSING   # MB or auto
    repeats: int = MISSING


# ---- ckpt: where checkpoints go (conf/ckpt/*.yaml) ----------------------------------------------------
@dataclass
class CkptConfig:
    name: str = MISSING
    dir: Optional[str] = MISSING
    every_n_steps: Optional[int] = MISSING
    every_n_minutes: Optional[float] = MISSING
    save_last: bool = MISSING
    keep_last_k: int = MISSING
    async_write: bool = MISSING
    storage_options: Dict[str, Any] = field(default_factory=dict)
    io: Any = MISSING        # the Trainer's CheckpointIO plugin (_target_)
    callback: Any = MISSING  # a Lightning callback (_target_) or null

    def __post_init__(self) -> None:
        _at_least("ckpt", self, 1, "every_n_steps", optional=True)
        _positive("ckpt", self, "every_n_minutes", optional=True)
        _at_least("ckpt", self, 0, "keep_last_k")


# ---- dist: processes and devices (conf/dist/*.yaml) ---------------------------------------------------
@dataclass
class SingleDistConfig:
    name: str = MISSING
    devices: Any = MISSING   # a whole number or auto
    num_nodes: int = MISSING
    strategy: str = MISSING

    def __post_init__(self) -> None:
        devices = self.devices
        if devices != "auto" and (isinstance(devices, bool) or not isinstance(devices, int) or devices < 1):
            raise ConfigError(f"dist.devices={devices!r} is not valid; use a whole number >= 1 or auto")
        _at_least("dist", self, 1, "num_nodes")
        if self.strategy != "ddp" and devices not in (1, "auto"):
            raise ConfigError(f"dist.devices={devices} with dist={self.name} is not valid: dist={self.name} runs one "
                              f"process; use dist=ddp dist.devices={devices}")
        if self.strategy != "ddp" and self.num_nodes != 1:
            raise ConfigError(f"dist.num_nodes={self.num_nodes} with dist={self.name} is not valid: dist={self.name} "
                              f"runs one process; use dist=ddp dist.num_nodes={self.num_nodes}")


@dataclass
class DDPDistConfig(SingleDistConfig):
    backend: Optional[str] = MISSING
    find_unused_parameters: bool = MISSING
    gradient_as_bucket_view: bool = MISSING
    static_graph: bool = MISSING
    p2p: Any = MISSING       # auto | on | off | an NCCL_P2P_LEVEL (YAML reads on/off as booleans)
    timeout_minutes: float = MISSING

    def __post_init__(self) -> None:
        super().__post_init__()
        _one_of("dist", self, "backend", (None, "nccl", "gloo", "mpi"))
        _positive("dist", self, "timeout_minutes")


# ---- data: the dataset (conf/data/*.yaml) -------------------------------------------------------------
@dataclass
class Argoverse2DataConfig:
    name: str = MISSING
    source: Any = MISSING    # the data source (_target_), fed by the keys below
    root: Optional[str] = MISSING
    size: str = MISSING
    train_split: str = MISSING
    val_split: str = MISSING

    def __post_init__(self) -> None:
        if self.root is None:  # the embedded set: its sizes (a real root's size is what it holds)
            sizes = _embedded_sizes(self.name)
            if sizes and self.size not in sizes:
                raise ConfigError(f"data.size={self.size!r} is not valid; choose one of: {', '.join(sizes)}")


@dataclass
class NuScenesDataConfig(Argoverse2DataConfig):
    version: Optional[str] = MISSING
    image_size: Optional[List[int]] = MISSING
    on_corrupt: str = MISSING

    def __post_init__(self) -> None:
        super().__post_init__()
        _one_of("data", self, "on_corrupt", ("fail", "skip"))
        if self.name == "nuscenes":
            _one_of("data", self, "version", (None, "v1.0-mini", "v1.0-trainval", "v1.0-test"))
        size = self.image_size
        if size is not None and (len(size) != 2 or any(isinstance(v, bool) or v < 1 for v in size)):
            raise ConfigError(f"data.image_size={list(size)} is not valid; use [width, height] in pixels, both >= 1, "
                              "or null (the size's default)")


@dataclass
class MMDet3DDataConfig(NuScenesDataConfig):
    dataset: str = MISSING


# ---- trainer: a partial lightning.pytorch.Trainer (conf/trainer/*.yaml) -------------------------------
@dataclass
class TrainerConfig:
    """Lightning Trainer arguments; the bench adds what exists only at run time (devices, strategy,
    precision, logger, callbacks, and ``max_steps`` when it is null). Any other Trainer argument may be
    appended (``+trainer.detect_anomaly=true``): :meth:`check_extra` accepts it."""

    # Trainer arguments the bench passes itself, and what sets each (an appended one would be ignored)
    SET_BY_THE_RUN: ClassVar[dict[str, str]] = {
        "accelerator": "machine.accelerator", "devices": "dist.devices", "num_nodes": "dist.num_nodes",
        "strategy": "the dist group", "precision": "accel.precision", "benchmark": "accel.cudnn_benchmark",
        "logger": "the logger group", "callbacks": "the callbacks group", "profiler": "bench.profile",
        "max_time": "bench.max_minutes", "limit_val_batches": "bench.val_batches",
        "default_root_dir": "the run directory (hydra.run.dir)", "enable_checkpointing": "the ckpt group",
        "num_sanity_val_steps": "drivebench (fixed)", "use_distributed_sampler": "drivebench (fixed)",
        "enable_model_summary": "drivebench (fixed)",
    }

    _target_: str = "lightning.pytorch.Trainer"
    _partial_: bool = True
    max_epochs: int = MISSING
    max_steps: Optional[int] = MISSING
    val_check_interval: Any = MISSING        # null, batches (int) or a fraction of the epoch (float)
    check_val_every_n_epoch: Optional[int] = MISSING
    log_every_n_steps: int = MISSING
    gradient_clip_val: Optional[float] = MISSING
    accumulate_grad_batches: int = MISSING
    deterministic: Any = MISSING             # true, false or "warn"

    def __post_init__(self) -> None:
        """Lightning's own rules, checked before any work (Lightning checks some only mid-run)."""
        _at_least("trainer", self, -1, "max_epochs")
        _at_least("trainer", self, -1, "max_steps", optional=True)
        _at_least("trainer", self, 1, "log_every_n_steps", "accumulate_grad_batches")
        _at_least("trainer", self, 1, "check_val_every_n_epoch", optional=True)
        _positive("trainer", self, "gradient_clip_val", optional=True, zero=True)
        interval = self.val_check_interval
        if interval is not None and (isinstance(interval, bool) or not isinstance(interval, (int, float))
                                     or interval <= 0 or (isinstance(interval, float) and interval > 1)):
            raise ConfigError(f"trainer.val_check_interval={interval!r} is not valid; use a number of batches >= 1, "
                              "a fraction of the epoch in (0, 1.0], or null")
        _one_of("trainer", self, "deterministic", (True, False, "warn"))

    @classmethod
    def check_extra(cls, key: str, value: Any) -> None:
        """An appended ``+trainer.<key>``: any ``lightning.pytorch.Trainer`` argument the run does not set."""
        import inspect

        import lightning.pytorch as pl

        if key in cls.SET_BY_THE_RUN:
            raise ConfigError(f"trainer.{key}={value} is not valid: the run sets it from {cls.SET_BY_THE_RUN[key]}")
        if key not in inspect.signature(pl.Trainer.__init__).parameters:
            raise ConfigError(f"trainer.{key}={value} is not a key of trainer nor a lightning.pytorch.Trainer "
                              f"argument; valid keys: {', '.join(sorted(f.name for f in fields(cls)))}")


# ---- machine: named machine profiles (conf/machine/*.yaml) --------------------------------------------
@dataclass
class SlurmConfig:
    partition: Optional[str] = MISSING
    constraint: Optional[str] = MISSING
    account: Optional[str] = MISSING
    qos: Optional[str] = MISSING
    timeout_min: int = MISSING


@dataclass
class MachineConfig:
    name: str = MISSING
    accelerator: str = MISSING
    gpus_per_node: Optional[int] = MISSING
    cpus_per_gpu: Optional[int] = MISSING
    mem_gb_per_gpu: Optional[float] = MISSING
    slurm: Optional[SlurmConfig] = MISSING

    def __post_init__(self) -> None:
        _one_of("machine", self, "accelerator", ("auto", "gpu", "cpu"))
        _at_least("machine", self, 1, "gpus_per_node", "cpus_per_gpu", optional=True)
        _positive("machine", self, "mem_gb_per_gpu", optional=True)


# ---- experiment: a named sweep's own keys (conf/experiment/*.yaml that declare an ``experiment`` node) --
BATCH_MODES = ("per_device", "global")
UNAVAILABLE_DEVICES = ("skip", "error")


@dataclass
class ScalingExperimentConfig:
    """``+experiment=scaling``: how the batch follows the device count, and what a job asking for more
    GPUs than the machine has does. ``devices`` and ``model_batch`` are interpolations of ``dist.devices``
    and ``model.batch_size``, here so that the batch rule is checked for every job of the sweep while
    Hydra composes it, before the first job starts (``drivebench.scaling`` applies it)."""

    name: str = MISSING
    batch: str = MISSING                 # per_device | global
    global_batch: Optional[int] = MISSING  # null = 8 x model_batch
    unavailable_devices: str = MISSING   # skip | error
    devices: Any = MISSING
    model_batch: Any = MISSING

    def __post_init__(self) -> None:
        from drivebench.scaling import per_device_batch

        per_device_batch(self.batch, self.global_batch, self.devices, self.model_batch)
        if self.unavailable_devices not in UNAVAILABLE_DEVICES:
            raise ConfigError(f"experiment.unavailable_devices={self.unavailable_devices!r} is not valid; "
                              f"choose one of: {', '.join(UNAVAILABLE_DEVICES)}")


# ---- the top level (conf/config.yaml) ------------------------------------------------------------------
@dataclass
class PathsConfig:
    cache: str = MISSING
    output_dir: Optional[str] = MISSING  # the run's directory; None only where Hydra made none (``--cfg job --resolve``)
    outputs_root: str = MISSING


@dataclass
class DrivebenchConfig:
    """The groups are typed by their own options' schemas (``model``, ``logger`` and ``callbacks`` have none:
    their keys are ``_target_`` arguments)."""

    seed: int = MISSING
    resume: Optional[str] = MISSING
    requeue: bool = MISSING   # SLURM: requeue after a SIGUSR1 stop (needs resume=auto)
    paths: PathsConfig = field(default_factory=PathsConfig)
    model: Any = MISSING
    data: Any = MISSING
    accel: Any = MISSING
    dist: Any = MISSING
    ckpt: Any = MISSING
    bench: Any = MISSING
    trainer: Any = MISSING
    callbacks: Any = MISSING
    logger: Any = MISSING
    machine: Any = MISSING
    experiment: Any = None   # a named sweep's own keys, when it declares them (+experiment=scaling)


# ---- the other commands' own options (drivebench report / doctor) -------------------------------------
@dataclass
class ReportOptions:
    dirs: List[str] = field(default_factory=list)    # folders holding runs (searched recursively)
    out: Optional[str] = None                        # where the report goes (default: the first folder)
    target: List[str] = field(default_factory=list)  # quality targets, METRIC<=VALUE (>=, <, > too)


@dataclass
class ReportCommand:
    report: ReportOptions = field(default_factory=ReportOptions)


@dataclass
class DoctorOptions:
    json: Optional[str] = None   # also write the records as JSON here
    skip_slow: bool = False      # skip the storage bandwidth, NCCL all-reduce and torch.compile checks


@dataclass
class DoctorCommand:
    doctor: DoctorOptions = field(default_factory=DoctorOptions)


# name in the ConfigStore -> schema (a group option's yaml names it in its defaults list)
SCHEMAS: dict[str, type] = {
    "schema_config": DrivebenchConfig,
    "schema_accel": AccelConfig,
    "schema_bench_train": TrainBenchConfig,
    "schema_bench_mmengine": MMEngineBenchConfig,
    "schema_bench_storage": StorageBenchConfig,
    "schema_ckpt": CkptConfig,
    "schema_dist_single": SingleDistConfig,
    "schema_dist_ddp": DDPDistConfig,
    "schema_data_argoverse2": Argoverse2DataConfig,
    "schema_data_nuscenes": NuScenesDataConfig,
    "schema_data_mmdet3d": MMDet3DDataConfig,
    "schema_trainer": TrainerConfig,
    "schema_machine": MachineConfig,
    "schema_experiment_scaling": ScalingExperimentConfig,
    "drivebench_report": ReportCommand,
    "drivebench_doctor": DoctorCommand,
}

def register() -> None:
    """Store every schema in Hydra's ConfigStore (idempotent; done on ``import drivebench``)."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    for name, schema in SCHEMAS.items():
        store.store(name=name, node=schema, provider="drivebench")


def valid_keys(node: DictConfig) -> list[str]:
    """The keys a node may hold: its schema's fields, else the keys it has."""
    schema = OmegaConf.get_type(node)
    if is_dataclass(schema):
        return sorted(f.name for f in fields(schema))
    return sorted(str(k) for k in node.keys())


def _post_init(schema: type, node: DictConfig) -> None:
    """Run ``schema.__post_init__`` (ConfigError) on the node's resolved values. A value that cannot be
    resolved yet (``${hydra:runtime.output_dir}`` before Hydra runs the job) is left out of the check as
    null, so the ``drivebench`` command checks a job before Hydra starts it."""
    from omegaconf.errors import InterpolationResolutionError

    def value_of(key: str) -> Any:
        try:
            value = OmegaConf.select(node, key, throw_on_resolution_failure=True, throw_on_missing=False)
            return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
        except InterpolationResolutionError as err:
            if "HydraConfig was not set" not in str(err):
                raise
            return None

    obj = schema.__new__(schema)  # not through __init__: it would convert (and resolve) every value
    for f in fields(schema):
        setattr(obj, f.name, value_of(f.name))
    obj.__post_init__()


def check(cfg: DictConfig, prefix: str = "") -> None:
    """What Hydra's composition lets through: keys appended with ``+`` to a typed node, and the
    ``__post_init__`` checks of the ``auto``-or-number knobs. ConfigError (one line) for either."""
    if not prefix:
        check_combinations(cfg)
    for key in cfg.keys():
        if not prefix and key == "hydra":
            continue  # Hydra's own node (with return_hydra_config): Hydra checks it
        if OmegaConf.is_missing(cfg, key) or OmegaConf.is_interpolation(cfg, key):
            continue
        node = cfg.get(key)
        if not isinstance(node, DictConfig):
            continue
        path = f"{prefix}{key}"
        schema = OmegaConf.get_type(node)
        if is_dataclass(schema):
            known = {f.name for f in fields(schema)}
            extra = sorted(str(k) for k in node.keys() if k not in known)
            for name in extra:
                value = OmegaConf.to_container(node, resolve=False)[name]
                if not hasattr(schema, "check_extra"):
                    raise ConfigError(f"{path}.{name}={value} is not a key of {path}; valid keys: "
                                      f"{', '.join(sorted(known))}")
                schema.check_extra(name, value)
            if hasattr(schema, "__post_init__"):
                _post_init(schema, node)
        check(node, prefix=f"{path}.")


def _embedded_sizes(data_name: str) -> list[str]:
    """The sizes of a data family's embedded set (none for a family without one)."""
    if data_name == "argoverse2":
        from drivebench.data.argoverse2.generate import SIZES

        return list(SIZES)
    if data_name == "nuscenes":
        from drivebench.data.nuscenes.generate import PRESETS

        return list(PRESETS)
    return []


def check_combinations(cfg: DictConfig) -> None:
    """The top level's values and what one group's choice asks of another (``data=nuscenes model=qcnet``:
    QCNet reads Argoverse 2). ConfigError (one line)."""
    ckpt = cfg.get("ckpt")
    if isinstance(ckpt, DictConfig) and OmegaConf.is_missing(ckpt, "dir"):  # before anything resolves ${ckpt.dir}
        raise ConfigError(f"ckpt={ckpt.get('name')} needs a destination: ckpt.dir=<directory or fsspec URL, "
                          "e.g. s3://bucket/run>")
    seed = cfg.get("seed")
    if isinstance(seed, int) and not isinstance(seed, bool) and not 0 <= seed < 2**32:
        raise ConfigError(f"seed={seed} is not valid; use a whole number in [0, 2**32 - 1]")
    family = OmegaConf.select(cfg, "model.data_family")
    data = OmegaConf.select(cfg, "data.name")
    if family is not None and data is not None and data != family:
        model = OmegaConf.select(cfg, "model.name")
        raise ConfigError(f"data={data} with model={model} is not valid: {model} reads {family} data; use "
                          f"data={family} (the model's default: leave data unset)")
