"""The accel knobs, resolved against the machine and checked before anything runs.

``drivebench/conf/accel/*.yaml`` are bundles of these fields (typed by ``drivebench.schemas.AccelConfig``);
``auto`` values are resolved here, once, so that the summary records what actually ran
(``num_workers: 15``, not ``auto``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Mapping

import torch
from torch import nn

from drivebench.accel.threads import ThreadBudget, check_knob, training_threads
from drivebench.errors import ConfigError, bad_choice
from drivebench.perf.machine import MachineInfo

PRECISIONS = ("32-true", "bf16-mixed", "16-mixed", "bf16-true", "auto-bf16")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
MAX_LOADER_WORKERS = 16
DEVICE_TRANSFORMS = ("off", "images", "decode")
# how the device decode opens its entry in ``settings.numerics_changed_by`` (the report reads summaries by it)
DECODE_CHANGE = "device_transform=decode"
CUDA_GRAPHS = ("off", "on", "auto")
ACTIVATION_CHECKPOINTING = ("keep", "off", "auto")
# auto turns a model's backbone checkpointing off where the activations it would drop (measured on
# the meta device for the run's batch, float32) fit in this share of the device's memory
CHECKPOINTING_AUTO_SHARE = 0.25


@dataclass
class AccelSettings:
    """One resolved accel preset (see drivebench/conf/accel/none.yaml for what each knob does)."""

    name: str
    preprocess_workers: int
    precompute_targets: bool
    shm_cache: bool
    shm_cache_max_gb: float
    gc_freeze: bool
    num_workers: int
    pin_memory: bool
    persistent_workers: bool
    prefetch_factor: int | None
    compile: bool
    compile_mode: str
    compile_dynamic: bool | None
    compile_cache: str  # auto | torch | a directory; app.build_run resolves auto to the directory in effect
    compile_shape_profile: bool  # keep Dynamo's dynamic-shape decisions between runs of one model setup (compile.py)
    precision: str
    tf32: bool
    cudnn_benchmark: bool
    channels_last: bool
    device_transform: str
    device_prefetch: bool
    prefetch_across_epochs: bool
    cuda_graphs: str  # off | on | auto here; app.build_run settles auto against the model and the run
    fused_optimizer: bool
    activation_checkpointing: str
    threads: int | str = "default"  # the training process's intra-op threads under the budget, or "default" (see threads.py)
    auto_trial: bool = False       # accel=auto: time candidate settings first, train with the fastest
    auto_numerics: bool = False    # the trial may change the number format (precision, TF32)
    auto_budget_s: float = 60.0    # the trial's cost bound (short fits: wall time; the run's segments: their excess)
    auto_steps: int = 10           # measured steps per candidate
    auto_warmup_steps: int = 5     # steps per candidate before those (compile, graph capture, workers starting)
    auto_margin: float = 0.05      # a gain under this share of the step is noise: the simpler setting stays
    auto_in_run: Any = "auto"       # live knobs timed on the run's own first steps: auto (on GPUs) | True | False

    @classmethod
    def resolve(cls, cfg: Mapping[str, Any], machine: MachineInfo, processes: int | None = None) -> "AccelSettings":
        """Resolve ``auto`` values for ``machine`` and check every value (ConfigError on bad input).

        ``cfg`` is a composed ``accel`` node: its keys are those of ``drivebench.schemas.AccelConfig``
        (Hydra refuses any other), the fields of this class. ``processes``: training processes on this
        machine (DDP ranks per node; default one per device), which share its cores."""
        on_gpu = machine.accelerator == "cuda"
        cores = max(machine.cpu_cores // (processes or machine.num_devices), 1)  # per training process
        thread_knob = check_knob(cfg["threads"])

        def count(key: str, auto: int) -> int:
            value = cfg[key]
            if value == "auto":
                return auto
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"accel.{key}={value!r} is not valid; use a whole number >= 0 or 'auto'")
            return value

        def flag(key: str, auto: bool) -> bool:
            value = cfg[key]
            if value == "auto":
                return auto
            if not isinstance(value, bool):
                raise ConfigError(f"accel.{key}={value!r} is not valid; use true, false or 'auto'")
            return value

        # GPU: a worker per core, one core left to the training process when a thread budget counts it
        keep = 0 if thread_knob == "default" else 1
        loader_auto = min(max(cores - keep, 1), MAX_LOADER_WORKERS) if on_gpu else max(cores // 2, 1)
        num_workers = count("num_workers", loader_auto)
        prefetch = cfg["prefetch_factor"]
        if prefetch is not None and (isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 1):
            raise ConfigError(f"accel.prefetch_factor={prefetch!r} is not valid; use a whole number >= 1 or null")
        precision = str(cfg["precision"])
        if precision not in PRECISIONS:
            raise bad_choice("accel.precision", precision, PRECISIONS)
        if precision == "auto-bf16":
            precision = "bf16-mixed" if (on_gpu and machine.bf16_supported) else "32-true"
        if precision in ("16-mixed", "bf16-true") and not on_gpu:
            raise ConfigError(f"accel.precision={precision} needs a GPU; this machine runs on the CPU (use 32-true)")
        mode = str(cfg["compile_mode"])
        if mode not in COMPILE_MODES:
            raise bad_choice("accel.compile_mode", mode, COMPILE_MODES)
        dynamic = cfg["compile_dynamic"]
        if dynamic not in (None, True, False):
            raise ConfigError(f"accel.compile_dynamic={dynamic!r} is not valid; use true, false or null")
        compile_cache = cfg.get("compile_cache", "auto")
        if not isinstance(compile_cache, str) or not compile_cache.strip():
            raise ConfigError(f"accel.compile_cache={compile_cache!r} is not valid; use auto, torch or a directory")
        shm_max = cfg["shm_cache_max_gb"]
        if shm_max == "auto":
            shm_max = 0.8 * (machine.shm_free_gb or 0.0)
        elif isinstance(shm_max, bool) or not isinstance(shm_max, (int, float)) or shm_max < 0:
            raise ConfigError(f"accel.shm_cache_max_gb={shm_max!r} is not valid; use a size in GB or 'auto'")
        device = cfg["device_transform"]
        if device is True:
            device = "decode"
        elif device is False or device is None:
            device = "off"
        if device == "auto":
            device = "decode" if on_gpu else "off"
        if device not in DEVICE_TRANSFORMS:
            raise bad_choice("accel.device_transform", cfg["device_transform"], (*DEVICE_TRANSFORMS, "auto"))
        graphs = cfg["cuda_graphs"]
        graphs = {True: "on", False: "off", None: "off"}.get(graphs, graphs)
        if graphs not in CUDA_GRAPHS:
            raise bad_choice("accel.cuda_graphs", cfg["cuda_graphs"], CUDA_GRAPHS)
        if graphs == "on" and not on_gpu:
            raise ConfigError("accel.cuda_graphs=on needs a CUDA GPU; this machine runs on the CPU (use off or auto)")
        if not on_gpu:
            graphs = "off"
        checkpointing = str(cfg["activation_checkpointing"])
        if checkpointing not in ACTIVATION_CHECKPOINTING:
            raise bad_choice("accel.activation_checkpointing", cfg["activation_checkpointing"], ACTIVATION_CHECKPOINTING)
        for key in ("auto_trial", "auto_numerics"):
            if not isinstance(cfg[key], bool):
                raise ConfigError(f"accel.{key}={cfg[key]!r} is not valid; use true or false")
        budget, margin = cfg["auto_budget_s"], cfg["auto_margin"]
        if isinstance(budget, bool) or not isinstance(budget, (int, float)) or budget <= 0:
            raise ConfigError(f"accel.auto_budget_s={budget!r} is not valid; use a number of seconds > 0")
        if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0 <= margin < 1:
            raise ConfigError(f"accel.auto_margin={margin!r} is not valid; use a fraction of the step in [0, 1), e.g. 0.05")
        if isinstance(cfg["auto_steps"], bool) or not isinstance(cfg["auto_steps"], int) or cfg["auto_steps"] < 1:
            raise ConfigError(f"accel.auto_steps={cfg['auto_steps']!r} is not valid; use a whole number >= 1")
        in_run = cfg.get("auto_in_run", "auto")
        if in_run != "auto" and not isinstance(in_run, bool):
            raise ConfigError(f"accel.auto_in_run={in_run!r} is not valid; use auto (on GPUs), true or false")
        persistent = flag("persistent_workers", num_workers > 0)
        if num_workers == 0:
            persistent, prefetch = False, None  # torch rejects these without workers: a no-op here
        return cls(
            name=str(cfg["name"]),
            preprocess_workers=count("preprocess_workers", machine.cpu_cores),
            precompute_targets=flag("precompute_targets", True),
            shm_cache=flag("shm_cache", True),
            shm_cache_max_gb=float(shm_max),
            gc_freeze=flag("gc_freeze", True),
            num_workers=num_workers,
            pin_memory=flag("pin_memory", on_gpu) and on_gpu,
            persistent_workers=persistent,
            prefetch_factor=prefetch,
            compile=flag("compile", on_gpu),
            compile_mode=mode,
            compile_dynamic=dynamic,
            compile_cache=compile_cache,
            compile_shape_profile=flag("compile_shape_profile", on_gpu),
            precision=precision,
            tf32=flag("tf32", on_gpu) and on_gpu,
            cudnn_benchmark=flag("cudnn_benchmark", on_gpu) and on_gpu,
            channels_last=flag("channels_last", on_gpu),
            device_transform=device,
            device_prefetch=flag("device_prefetch", device != "off") and on_gpu,
            prefetch_across_epochs=flag("prefetch_across_epochs", num_workers > 0),
            cuda_graphs=graphs,
            fused_optimizer=flag("fused_optimizer", on_gpu) and on_gpu,
            activation_checkpointing=checkpointing,
            threads=training_threads(thread_knob, cores, num_workers) or "default",
            auto_trial=cfg["auto_trial"],
            auto_numerics=cfg["auto_numerics"],
            auto_budget_s=float(budget),
            auto_steps=cfg["auto_steps"],
            auto_warmup_steps=count("auto_warmup_steps", 5),
            auto_margin=float(margin),
            auto_in_run=cfg.get("auto_in_run", "auto"),
        )

    def decodes_jpegs(self, decodes_on_device: bool | None = None) -> bool:
        """Whether JPEGs are decoded on the device: the knob says ``decode`` and the pipeline has images to decode
        (``decodes_on_device``; None: as the knob says)."""
        return self.device_transform == "decode" and decodes_on_device is not False

    def numerics_changes(self, compiles: bool | None = None, decodes_on_device: bool | None = None) -> list[str]:
        """Knobs in effect that change the arithmetic (not only where/when work happens).

        ``compiles`` / ``decodes_on_device``: whether this run really compiles a unit and decodes images
        on the device (None: as the knobs say). A knob that is on but has nothing to act on (QCNet
        declares no compile units and has no images) changes nothing, so it is not listed."""
        changes = []
        if self.precision != "32-true":
            changes.append(f"precision={self.precision}")
        if self.tf32:
            changes.append("tf32")
        if self.compile and compiles is not False:
            changes.append("compile")
        if self.cudnn_benchmark:
            changes.append("cudnn_benchmark")
        if self.fused_optimizer:
            changes.append("fused_optimizer (one fused Adam kernel: the same update, rounded differently)")
        if self.cuda_graphs == "on":
            changes.append("cuda_graphs (batches padded to a few shapes: the same loss up to summation order; "
                           "dropout masks drawn over the padded tensors)")
        if self.decodes_jpegs(decodes_on_device):
            changes.append(f"{DECODE_CHANGE} (nvjpeg decode and bilinear warps differ from the CPU path "
                           "in the last bits)")
        return changes

    def settle_fused_optimizer(self, requested: Any, gradient_clip_val: float | None) -> str:
        """Turn the fused optimizer off where Lightning cannot clip with it; returns the summary status.

        Lightning's mixed-precision plugin unscales gradients before it clips them and refuses an
        optimizer that unscales inside its own step (torch's ``fused=True`` Adam): with
        ``trainer.gradient_clip_val`` set under ``*-mixed`` precision the run would fail at its first
        clipped step. ``auto`` turns the kernel off there (multi-tensor ``foreach`` updates remain);
        an explicit ``true`` is refused before any work."""
        if not self.fused_optimizer:
            return "off"
        if not gradient_clip_val or not self.precision.endswith("-mixed"):
            return "on"
        if requested is True:
            raise ConfigError(
                f"accel.fused_optimizer=true cannot run with trainer.gradient_clip_val={gradient_clip_val:g} under "
                f"accel.precision={self.precision}: Lightning clips unscaled gradients and the fused kernel unscales "
                "inside its step; use accel.fused_optimizer=auto (off here) or trainer.gradient_clip_val=null")
        self.fused_optimizer = False
        return (f"off: gradient clipping (trainer.gradient_clip_val={gradient_clip_val:g}) under {self.precision}, "
                "which Lightning cannot do with a fused optimizer")

    def settle_shape_profile(self, requested: Any, net: nn.Module) -> str:
        """Keep the shape profile only where it can help; returns the summary status.

        The profile makes a run compile dynamic from its first step the dimensions that varied in the last run,
        so that batches arriving in another order (another seed) find the cache's graphs. A model whose compiled
        shapes do not depend on the data (``net.compiled_shapes_vary_with_data`` False; models without the
        attribute count as varying) has nothing to gain and loses its second run's cache: a dimension that
        varies for a structural reason (SparseDrive's aggregation code sees 900 detection and 100 map anchors)
        goes dynamic from the first step of the next run, whose graphs then differ from the first run's (b61,
        one H100: the second run on a cache compiled for 228 s with 6 of 15 graphs from it, the third 50 s with
        all). ``auto`` turns it off there; an explicit ``true`` keeps it."""
        if not (self.compile and self.compile_shape_profile):
            return "off"
        if requested is True or getattr(net, "compiled_shapes_vary_with_data", True):
            return "on"
        self.compile_shape_profile = False
        return ("off: the model's compiled shapes do not depend on the data, so the cache of one run serves "
                "the next whatever its seed")

    def apply_activation_checkpointing(self, net: nn.Module, machine: MachineInfo, batch_size: int) -> dict[str, Any]:
        """Resolve ``activation_checkpointing`` for ``net`` and switch its backbones; returns the summary record.

        ``keep``: the model's own setting (``model.net.activation_checkpointing``, upstream's default);
        ``off``: never; ``auto``: off on a CUDA device when the activations checkpointing would drop
        for this batch fit in ``CHECKPOINTING_AUTO_SHARE`` of its memory, kept otherwise. It changes
        memory and time, not arithmetic (tests/test_activation_checkpointing.py).
        """
        from drivebench.models.common.checkpointing import checkpointable_backbones, set_activation_checkpointing

        backbones = checkpointable_backbones(net)
        record: dict[str, Any] = {"knob": self.activation_checkpointing}
        if not backbones:
            return {**record, "model_default": None, "enabled": False,
                    "reason": "the model has no checkpointable backbone"}
        default = any(b.activation_checkpointing for b in backbones)
        record["model_default"] = default
        enabled, reason = default, "model.net.activation_checkpointing (upstream's setting)"
        if self.activation_checkpointing == "off":
            enabled, reason = False, "accel.activation_checkpointing=off"
        elif self.activation_checkpointing == "auto" and default:
            fits, why, measured = checkpointing_off_fits(net, machine, batch_size)
            record.update(measured)
            enabled, reason = not fits, f"auto: {'off' if fits else 'kept'} ({why})"
        set_activation_checkpointing(net, enabled)
        return {**record, "enabled": enabled, "reason": reason}

    def thread_budget(self, knob: int | str, machine: MachineInfo, processes: int | None = None) -> ThreadBudget:
        """The thread budget of ``accel.threads=knob`` for these workers on ``machine`` (not yet applied)."""
        return ThreadBudget.plan(knob, machine.cpu_cores, machine.cpu_cores_source,
                                 processes or machine.num_devices, self.num_workers, self.preprocess_workers)

    def apply_global_flags(self) -> None:
        """Process-wide torch switches (matmul precision, cuDNN autotuning)."""
        set_tf32(self.tf32)
        set_cudnn_benchmark(self.cudnn_benchmark)

    def loader_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``torch.utils.data.DataLoader``."""
        kwargs: dict[str, Any] = {
            "num_workers": self.num_workers,
            "pin_memory": self.pin_memory,
            "persistent_workers": self.persistent_workers,
        }
        if self.num_workers > 0 and self.prefetch_factor is not None:
            kwargs["prefetch_factor"] = self.prefetch_factor
        return kwargs

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def checkpointing_off_fits(net: nn.Module, machine: MachineInfo, batch_size: int) -> tuple[bool, str, dict[str, float]]:
    """Whether ``net``'s backbones can stop checkpointing for this batch: the activations they would then keep
    (measured on the meta device, float32) fit in ``CHECKPOINTING_AUTO_SHARE`` of the smallest GPU's memory.

    ``activation_checkpointing=auto``'s rule, and ``accel=auto``'s condition for timing checkpointing off on the
    run's own steps (a step that runs out of memory there would end the run; a short fit only fails its row).
    Returns (fits, why, the measured figures for the summary)."""
    from drivebench.models.common.checkpointing import checkpointable_backbones, saved_activation_bytes

    shape_of = getattr(net, "backbone_input_shape", None)
    if machine.accelerator != "cuda" or not machine.gpus:
        return False, "not a CUDA device", {}
    if shape_of is None:
        return False, "the model gives no backbone input shape to measure with", {}
    saved = sum(saved_activation_bytes(b, shape_of(batch_size)) for b in checkpointable_backbones(net)) / 2**30
    budget = CHECKPOINTING_AUTO_SHARE * min(g.memory_gb for g in machine.gpus)
    measured = {"saved_gib_estimate": round(saved, 3), "budget_gib": round(budget, 2)}
    if saved <= budget:
        return True, (f"drops {saved:.2f} GiB of activations at batch {batch_size}, "
                      f"within {CHECKPOINTING_AUTO_SHARE:.0%} of device memory"), measured
    return False, (f"{saved:.2f} GiB of activations at batch {batch_size} exceed "
                   f"{CHECKPOINTING_AUTO_SHARE:.0%} of device memory"), measured


def set_tf32(on: bool) -> None:
    """``accel.tf32``: TF32 tensor cores for fp32 matmuls and convolutions, process-wide (also switched between
    two steps by ``accel=auto``'s trial on the run's own steps)."""
    torch.set_float32_matmul_precision("high" if on else "highest")
    torch.backends.cudnn.allow_tf32 = bool(on)


def set_cudnn_benchmark(on: bool) -> None:
    """``accel.cudnn_benchmark``: cuDNN times its algorithms per input shape and keeps the fastest."""
    torch.backends.cudnn.benchmark = bool(on)
