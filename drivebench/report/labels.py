"""Human labels that group runs: the machine a run ran on and the accel setting (and model speed knobs) it used.

Both come from what the run recorded (``summary.json``, ``.hydra/overrides.yaml``), never from the
folder it sits in.
"""

from __future__ import annotations

import shlex
from typing import Any, Iterable

LOCAL_PROFILE = "local"


def hardware_label(machine: dict[str, Any]) -> str:
    """``1x NVIDIA H200`` for GPU runs; ``CPU (AMD EPYC, 2 cores)`` for CPU-only ones."""
    gpus = machine.get("gpus") or []
    if gpus:
        names = sorted({str(g.get("name", "GPU")) for g in gpus})
        return f"{len(gpus)}x {' + '.join(names)}"
    cpu = machine.get("cpu_model") or "unknown CPU"
    cores = machine.get("cpu_cores")
    return f"CPU ({cpu}, {cores} cores)" if cores else f"CPU ({cpu})"


def machine_label(machine: dict[str, Any], profile: str | None, gpu_shared: bool = False) -> str:
    """Hardware plus where it ran: the named profile (``h200``) or, for ``machine=local``, the host; and
    ``, GPU shared`` for a run whose GPU another process shared.

    Two nodes of one named profile count as one machine; two local machines stay apart by hostname. A run on a
    shared GPU is a machine of its own: its times measure the other process's work too, so the report compares
    it only with runs that shared theirs (QCNet `none` on an H200 beside a second run: 11.8 samples/s; alone 13.7-18.4).
    """
    where = profile if profile and profile != LOCAL_PROFILE else (machine.get("hostname") or profile or "?")
    return f"{hardware_label(machine)} @ {where}" + (", GPU shared" if gpu_shared else "")


def setting_overrides(overrides: Iterable[str]) -> dict[str, str]:
    """The speed knobs a run's command line changed, knob -> value: ``accel.<knob>=<value>`` as ``<knob>`` and
    ``model.net.<knob>=<value>`` as ``net.<knob>`` (``+``/``++`` forms too).

    A model's own speed choices (GaussianFormer's ``model.net.aggregation``, ``compile_scope``) are part of the
    setting: two ``max`` runs differing only there are different settings, not repeats of one.
    """
    out: dict[str, str] = {}
    for item in overrides:
        key, sep, value = item.partition("=")
        key = key.lstrip("+~")
        if sep and key.startswith("accel.") and key.count(".") == 1:
            out[key.split(".", 1)[1]] = value
        elif sep and key.startswith("model.net.") and key.count(".") == 2:
            out["net." + key.rsplit(".", 1)[1]] = value
    return out


def command_overrides(command: str | None) -> list[str]:
    """The ``key=value`` words of a recorded command line (``run.command`` in the summary)."""
    if not command:
        return []
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    return [w for w in words if "=" in w and not w.startswith("-")]


def setting_label(accel_name: str | None, knob_overrides: dict[str, str]) -> str:
    """The accel preset (or ablation step) name, then each knob the run changed on top of it.

    ``none`` -> ``none``; ``accel=none accel.num_workers=4`` -> ``none num_workers=4``.
    """
    name = accel_name or "?"
    extra = [f"{k}={v}" for k, v in sorted(knob_overrides.items()) if k != "name"]
    return " ".join([name, *extra])
