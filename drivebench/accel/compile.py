"""torch.compile per compile unit, with fallback to eager and a record of graph breaks.

A model may expose ``compile_units() -> dict[str, nn.Module]`` naming the parts worth compiling
(e.g. the image backbone and the heads, leaving out a CPU-side matcher); otherwise the whole net is
one unit. ``nn.Module.compile`` compiles in place, so parameter names and checkpoints are the same
as in eager mode. Dynamo's ``suppress_errors`` makes a unit that fails to compile run eagerly
instead of killing the run; the failure and every graph break are counted for the summary.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from pathlib import Path
from typing import Any, Mapping

import torch
from torch import nn

from drivebench.accel.settings import AccelSettings


MULTI_UNIT_RECOMPILE_LIMIT = 64


INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"


def _torch_default_cache_dir() -> str:
    try:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    except ImportError:  # an older torch (the range starts at 2.4) keeps the function elsewhere; same place
        import getpass
        import tempfile

        return os.path.join(tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}")
    return default_cache_dir()


def use_compile_cache(knob: str, cache_root: str | Path) -> str:
    """Point Inductor's on-disk cache (compiled graphs, Triton kernels, autotuning) at the directory that
    ``accel.compile_cache`` names and return it: ``auto`` keeps ``$TORCHINDUCTOR_CACHE_DIR`` when it names
    another directory than torch's default, else ``<cache_root>/inductor``, which outlives /tmp; ``torch``
    leaves torch's own choice. A warm cache is what turns QCNet's first compiled step from ~165 s into
    ~38 s on an H200 (docs/accel.md).

    torch writes its default into the variable the first time anything asks for the directory (importing
    Lightning does), so a variable holding torch's default says nothing about the user's wish."""
    exported = os.environ.get(INDUCTOR_CACHE_ENV)
    if knob == "torch":
        return exported or _torch_default_cache_dir()
    if knob == "auto":
        chosen = exported and os.path.abspath(exported) != os.path.abspath(_torch_default_cache_dir())
        directory = exported if chosen else str(Path(cache_root).expanduser() / "inductor")
    else:
        directory = str(Path(knob).expanduser())
    directory = os.path.abspath(directory)
    os.environ[INDUCTOR_CACHE_ENV] = directory  # read by Inductor at each cache access, inherited by workers and ranks
    return directory


# the model node's parts that fix the shapes a compiled unit sees (the rest, optimizer and schedule, do not)
_SHAPE_MODEL_KEYS = ("net", "transform", "collate", "batch_sampler", "module", "batch_size", "val_batch_size")
# the accel knobs that change what is traced (dtypes, padded shapes, memory formats, what runs on the device)
_SHAPE_ACCEL_KEYS = ("precision", "compile_mode", "compile_dynamic", "cuda_graphs", "channels_last",
                     "device_transform", "activation_checkpointing")
_profile_set_here: str | None = None


def shape_profile_key(model: Mapping[str, Any], settings: AccelSettings) -> str:
    """The job id under which ``accel.compile_shape_profile`` keeps Dynamo's dynamic-shape decisions: readable
    (model, size, batch size, precision) and a digest of everything else that fixes the traced shapes, so that
    runs of another size or batch size never mark each other's dimensions dynamic (a shared id would: the
    profile is keyed by code object, and every size runs the same layers' code)."""
    parts = {key: model.get(key) for key in _SHAPE_MODEL_KEYS}
    parts.update({key: getattr(settings, key) for key in _SHAPE_ACCEL_KEYS})
    digest = hashlib.sha1(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:12]
    return (f"drivebench-{model.get('name')}-{model.get('size')}-b{model.get('batch_size')}-"
            f"{settings.precision}-{digest}")


def use_shape_profile(key: str | None) -> str | None:
    """Turn torch's local PGO on under ``key`` (``torch.compiler.config.job_id``; the profile lives in the
    Inductor cache directory in effect, one file per job id and rank), or back off with None. Why: Dynamo
    compiles a dimension static until a second size arrives, so runs whose batches come in another order
    compile other graphs and miss a warm cache; the profile makes every later run start with the dimensions
    that varied dynamic. A job id the user set in torch is left alone. Returns the job id in effect."""
    global _profile_set_here
    config = getattr(torch.compiler, "config", None)
    if config is None or not hasattr(config, "job_id"):  # a torch without PGO: nothing to keep
        return None
    if key is not None and config.job_id in (None, _profile_set_here):
        config.job_id = _profile_set_here = key
    elif key is None and _profile_set_here is not None and config.job_id == _profile_set_here:
        config.job_id = _profile_set_here = None
    return config.job_id


def compile_units(net: nn.Module) -> dict[str, nn.Module]:
    units = getattr(net, "compile_units", None)
    if callable(units):
        return dict(units())
    return {"net": net}


def apply_compile(net: nn.Module, settings: AccelSettings, shape_profile: str | None = None) -> list[str]:
    """Compile ``net``'s units in place when ``settings.compile``; returns the unit names. ``shape_profile``:
    the job id to keep Dynamo's shape decisions under (``shape_profile_key``; the caller passes one where
    ``accel.compile_shape_profile`` is on), None for none."""
    use_shape_profile(shape_profile if settings.compile else None)
    if not settings.compile:
        return []
    import torch._dynamo

    torch._dynamo.config.suppress_errors = True
    units = compile_units(net)
    if len(units) > 1:
        # units of one class share their code object, and dynamo's recompile limit (8) counts the variants of
        # a code object: QCNet's 34 layers (Fourier embeddings of 1-4 features, several edge-list shapes) need
        # more than 8, and past the limit a unit silently runs eagerly
        config = torch._dynamo.config
        config.recompile_limit = max(config.recompile_limit, MULTI_UNIT_RECOMPILE_LIMIT)
    names = []
    for name, module in units.items():
        module.compile(mode=settings.compile_mode, dynamic=settings.compile_dynamic)
        names.append(name)
    return names


def compile_report() -> dict[str, Any]:
    """Graph count, graph breaks and their most common reasons, from dynamo's counters; the recompiles and
    why; and where the compilation's time went, with the on-disk cache's hits (a warm cache is why a second
    run starts sooner)."""
    try:
        from torch._dynamo.utils import counters
    except Exception:  # torch without dynamo
        return {}
    breaks = Counter({str(reason): n for reason, n in counters["graph_break"].items()})
    config = getattr(torch.compiler, "config", None)
    return {
        "shape_profile": getattr(config, "job_id", None),  # the job id whose dynamic-shape profile this run used
        "graphs": int(counters["stats"].get("unique_graphs", 0)),
        "graph_breaks": int(sum(breaks.values())),
        "top_break_reasons": [f"{n}x {reason[:200]}" for reason, n in breaks.most_common(5)],
        "frames_failed": int(counters["frames"].get("failed", 0)) if "frames" in counters else 0,
        "recompiles": recompile_report(),
        **compile_time_report(counters),
    }


def recompile_report() -> dict[str, Any]:
    """How often compiled frames were compiled again because their guards failed, and why (dynamo's
    ``guard_failures``: a new input size, stride or dtype, a changed global such as autocast). A size change
    also makes the frame's later graphs dynamic in that size (``automatic_dynamic_shapes``), and dynamic
    graphs can run slower than the static ones of a run that never changed: this is where a compiled run
    slower than another with the same settings shows why. ``count``: the recompiles of every frame (its
    cached graphs but the first); ``frames``: the five most recompiled, each with its distinct reasons."""
    try:
        from torch._dynamo.eval_frame import _debug_get_cache_entry_list
        from torch._dynamo.utils import guard_failures
    except Exception:  # a torch that keeps neither
        return {}
    frames = []
    for code, failures in list(guard_failures.items()):
        try:
            recompiles = max(len(_debug_get_cache_entry_list(code)) - 1, 0)
        except (TypeError, RuntimeError, AttributeError):  # a key that is no code object: nothing to count
            continue
        # each failure reads "<frame>/<compile>: <reason>"; one recompile lists a failure per cached graph
        texts = (str(failure).strip() for failure in failures)
        reasons = dict.fromkeys(text.split(": ", 1)[-1].splitlines()[0][:200] for text in texts if text)
        frames.append({"frame": f"{code.co_name} ({Path(code.co_filename).name}:{code.co_firstlineno})",
                       "recompiles": recompiles, "reasons": list(reasons)[:3]})
    frames.sort(key=lambda frame: -frame["recompiles"])
    return {"count": int(sum(frame["recompiles"] for frame in frames)), "frames": frames[:5]}


# dynamo's timers (``torch._dynamo.utils.compilation_time_metrics``, seconds per call) that say where
# compilation went: the frames it compiled (tracing plus the forward, and backward unless deferred), the
# backward graphs compiled at their first backward, and inside those Inductor's share
_FRAME_TIMER, _LAZY_BACKWARD_TIMER, _INDUCTOR_TIMER = (
    "_compile.compile_inner", "backward._backward_impl", "compile_fx_inner")
# inside the frames' seconds, where a warm start goes (a warm QCNet start on an H200 still took 18.7 s
# with every graph from the caches): dynamo's bytecode tracing, its guards, the backend call (AOTAutograd and
# Inductor: cache keys, lookups and loads on a hit, the compilation on a miss), and within that the loads
# of cached graphs and of their generated modules (nested timers: the phases overlap, they do not add up)
_PHASE_TIMERS = (("dynamo_tracing", "bytecode_tracing"), ("guards", "build_guards"),
                 ("backend", "OutputGraph.call_user_compiler"), ("cached_graph_loads", "AOTAutogradCache.inductor_load"),
                 ("module_loads", "PyCodeCache.load_by_key_path"))


def compile_time_report(counters: Any) -> dict[str, Any]:
    """``compile_s`` {total, frames, lazy_backward, inductor, each_frame, phases} and the FX-graph and AOTAutograd
    caches' hits and misses; empty where this torch keeps neither timers nor cache counters."""
    try:
        from torch._dynamo.utils import compilation_time_metrics as timers
    except Exception:
        return {}
    seconds = {key: round(float(sum(timers.get(timer, ()))), 2) for key, timer in
               (("frames", _FRAME_TIMER), ("lazy_backward", _LAZY_BACKWARD_TIMER), ("inductor", _INDUCTOR_TIMER))}
    report: dict[str, Any] = {"compile_s": {"total": round(seconds["frames"] + seconds["lazy_backward"], 2), **seconds,
                                            # each frame compilation in order, recompiles included: which one cost
                                            "each_frame": [round(float(t), 2) for t in timers.get(_FRAME_TIMER, ())],
                                            "phases": {name: round(float(sum(timers[timer])), 2)
                                                       for name, timer in _PHASE_TIMERS if timer in timers}}}
    inductor, aot = counters.get("inductor", {}), counters.get("aot_autograd", {})
    report["fx_graph_cache"] = {"hits": int(inductor.get("fxgraph_cache_hit", 0)),
                                "misses": int(inductor.get("fxgraph_cache_miss", 0))}
    report["aot_autograd_cache"] = {"hits": int(aot.get("autograd_cache_hit", 0)),
                                    "misses": int(aot.get("autograd_cache_miss", 0))}
    return report


def to_channels_last(net: nn.Module, on: bool = True) -> None:
    """NHWC memory format for convolutional parts (no-op for models without 4-D conv weights); ``on=False``
    back to the default (NCHW). In place: the parameters stay the optimizer's."""
    memory_format = torch.channels_last if on else torch.contiguous_format
    for module in net.modules():
        if isinstance(module, nn.Conv2d):
            module.to(memory_format=memory_format)
