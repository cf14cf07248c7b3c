"""The NCCL peer-to-peer verdict: deciding it from measurements, and caching it per machine.

The doctor measures an all-reduce between every pair of GPUs with P2P on and with
``NCCL_P2P_DISABLE=1``, decides what DDP should use, and stores the verdict in
``<paths.cache>/doctor/p2p.json``, keyed by the GPU names, their count and the driver version.
Training with ``dist.p2p=auto`` calls :func:`cached_p2p_verdict` and applies the answer:
``"on"`` (NCCL's default), ``"off"`` (``NCCL_P2P_DISABLE=1``) or an ``NCCL_P2P_LEVEL`` value
(``"NVL"``, ``"PIX"``, ...: P2P only over paths at most that distant).

It lives outside :mod:`drivebench.doctor` because both sides use it: the doctor writes the
verdict, training (:mod:`drivebench.dist`) reads it. It imports nothing heavy and does not
initialise CUDA when NVML is there (names come from NVML), so a launcher may call it before it
spawns its workers.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from drivebench.hardware import nvml

log = logging.getLogger(__name__)

LEVELS = ("LOC", "NVL", "PIX", "PXB", "PHB", "SYS")  # NCCL_P2P_LEVEL values, nearest path first
VERDICTS = ("on", "off", *LEVELS)
CACHE_FILE = Path("doctor") / "p2p.json"
CACHE_VERSION = 1
SLOWER_THAN_OFF = 0.8  # P2P-on bus bandwidth below 80% of P2P-off: the P2P path is degraded


@dataclass
class PairMeasure:
    """All-reduce between GPUs ``a`` and ``b`` with P2P on and off (None: not measured)."""

    a: int
    b: int
    nccl_level: str | None = None          # the path between them as an NCCL_P2P_LEVEL (NVL, PIX, ...)
    on_ok: bool | None = None
    on_busbw_gbs: float | None = None
    on_error: str | None = None
    off_ok: bool | None = None
    off_busbw_gbs: float | None = None
    off_error: str | None = None

    @property
    def p2p_good(self) -> bool:
        """P2P works between them and is not slower than going without it."""
        if not self.on_ok:
            return False
        if self.off_busbw_gbs and self.on_busbw_gbs is not None:
            return self.on_busbw_gbs >= SLOWER_THAN_OFF * self.off_busbw_gbs
        return True

    @property
    def dead(self) -> bool:
        """NCCL fails between them with and without P2P: not a P2P problem."""
        return self.on_ok is False and self.off_ok is False

    @property
    def label(self) -> str:
        return f"{self.a}-{self.b}"


@dataclass
class P2PVerdict:
    value: str | None                       # "on" | "off" | an NCCL_P2P_LEVEL | None (nothing measured)
    reason: str
    bad_pairs: list[str] = field(default_factory=list)
    dead_pairs: list[str] = field(default_factory=list)


def recommend_p2p(pairs: list[PairMeasure]) -> P2PVerdict:
    """What DDP should use, from the pair measurements.

    "on" when P2P works on every pair; otherwise the widest NCCL_P2P_LEVEL that keeps P2P on every
    pair where it was verified and off on every pair where it was not (needs the link of each pair);
    otherwise "off".
    """
    if not pairs:
        return P2PVerdict(None, "fewer than two GPUs: no peer-to-peer path to test")
    measured = [p for p in pairs if p.on_ok is not None]
    if not measured:
        return P2PVerdict(None, "no pair was measured")
    good = [p for p in pairs if p.p2p_good]
    unverified = [p for p in pairs if not p.p2p_good]
    bad = [p.label for p in pairs if p.on_ok is not None and not p.p2p_good]
    dead = [p.label for p in pairs if p.dead]
    if not unverified:
        return P2PVerdict("on", f"P2P all-reduce works on all {len(pairs)} pair(s) and is the fastest path")
    level = _widest_safe_level(good, unverified)
    if level is not None:
        return P2PVerdict(level, f"P2P works over {level} paths and breaks or is slow beyond them (pairs "
                                 f"{', '.join(bad)}): NCCL_P2P_LEVEL={level} keeps it where it works", bad, dead)
    return P2PVerdict("off", f"P2P breaks or is slower than going without it on pair(s) {', '.join(bad) or '?'}",
                      bad, dead)


def _widest_safe_level(good: list[PairMeasure], unverified: list[PairMeasure]) -> str | None:
    if not good or any(p.nccl_level not in LEVELS for p in good + unverified):
        return None
    widest_good = max(LEVELS.index(p.nccl_level) for p in good)  # type: ignore[arg-type]
    nearest_bad = min(LEVELS.index(p.nccl_level) for p in unverified)  # type: ignore[arg-type]
    return LEVELS[widest_good] if widest_good < nearest_bad else None


def machine_key(gpu_names: list[str], driver: str | None) -> str:
    """Cache key: the GPUs (in CUDA order), how many, and the driver that measured them."""
    return f"{len(gpu_names)}x[{', '.join(gpu_names)}] driver {driver or 'unknown'}"


def current_machine_key() -> str | None:
    """The key of the GPUs this process may use, or None without GPUs. Does not initialise CUDA."""
    names = nvml.visible_gpu_names()
    if names is None:  # no NVML (or MIG ids): ask torch, which does initialise CUDA here
        try:
            import torch

            if not torch.cuda.is_available():
                return None
            names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        except Exception:
            return None
    if not names:
        return None
    info = nvml.driver_info()
    return machine_key(names, info[0] if info else None)


def cache_path(cache_root: Path) -> Path:
    """``<paths.cache>/doctor/p2p.json``."""
    return Path(cache_root).expanduser() / CACHE_FILE


def read_cache(cache_root: Path) -> dict[str, Any]:
    """The cache file's ``machines`` table ({} when absent or unreadable)."""
    path = cache_path(cache_root)
    try:
        content = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as err:
        log.warning("ignoring unreadable P2P cache %s (%s); `python -m drivebench.doctor` rewrites it", path, err)
        return {}
    machines = content.get("machines") if isinstance(content, dict) else None
    return machines if isinstance(machines, dict) else {}


def write_verdict(cache_root: Path, key: str, verdict: P2PVerdict, pairs: list[PairMeasure],
                  extra: dict[str, Any] | None = None) -> Path:
    """Store (or replace) this machine's verdict; other machines' entries are kept. Atomic."""
    path = cache_path(cache_root)
    path.parent.mkdir(parents=True, exist_ok=True)
    machines = read_cache(cache_root)
    machines[key] = {
        "verdict": verdict.value,
        "reason": verdict.reason,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "pairs": [asdict(p) for p in pairs],
        **(extra or {}),
    }
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".p2p-", suffix=".json")
    with os.fdopen(fd, "w") as handle:
        json.dump({"version": CACHE_VERSION, "machines": machines}, handle, indent=2, default=str)
    os.replace(tmp, path)
    return path


def cached_verdict_for(cache_root: Path, key: str | None) -> str | None:
    """The cached verdict for ``key`` (validated), or None."""
    if key is None:
        return None
    entry = read_cache(cache_root).get(key)
    value = entry.get("verdict") if isinstance(entry, dict) else None
    return value if value in VERDICTS else None


def cached_p2p_verdict(cache_dir: Path) -> str | None:
    """The doctor's P2P verdict for the GPUs of this machine, or None when it has not measured them.

    Args:
        cache_dir: the run's ``paths.cache`` (the file read is ``<cache_dir>/doctor/p2p.json``).

    Returns:
        ``"on"``, ``"off"`` or an ``NCCL_P2P_LEVEL`` value (``"NVL"``, ``"PIX"``, ``"PXB"``,
        ``"PHB"``, ``"SYS"``), measured on GPUs with the same names, count and driver; None
        without GPUs, without a cache entry, or when the GPUs or the driver changed since.
        ``dist.p2p=auto`` maps "off" to ``NCCL_P2P_DISABLE=1``, a level to ``NCCL_P2P_LEVEL``,
        and "on" / None to NCCL's default.
    """
    return cached_verdict_for(Path(cache_dir), current_machine_key())
