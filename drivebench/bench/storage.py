"""``bench=storage``: which checkpoint location is faster? Write and read a checkpoint-sized file
in each candidate directory (local paths or fsspec URLs) several times, with fsync, and compare.
The write is the doctor's probe (:mod:`drivebench.ckpt.write_probe`).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from omegaconf import OmegaConf

from drivebench.app import Run
from drivebench.ckpt.store import CheckpointStore
from drivebench.ckpt.write_probe import probe_name, remove, timed_read, timed_write
from drivebench.errors import ConfigError
from drivebench.perf.stats import describe
from drivebench.perf.bottleneck import diagnose
from drivebench.perf.summary import SCHEMA_VERSION, write_summary
from drivebench.secrets import redact_url


def _split_dirs(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [d.strip() for d in value.split(",") if d.strip()]
    return [str(d) for d in value]


class StorageBench:
    """Args: dirs (list, or comma-separated; default: ``ckpt.dir``), size_mb (``auto`` = the model's
    checkpoint size: weights + two Adam moments), repeats."""

    def __init__(self, mode: str = "storage", dirs: Any = None, size_mb: Any = "auto", repeats: int = 5,
                 **_: Any) -> None:
        if not isinstance(repeats, int) or repeats < 1:
            raise ConfigError(f"bench.repeats={repeats!r} is not valid; use a whole number >= 1")
        self.mode = mode
        self.dirs = dirs
        self.size_mb = size_mb
        self.repeats = repeats

    def run(self, run: Run) -> dict[str, Any]:
        dirs = _split_dirs(self.dirs) or _split_dirs(run.cfg.ckpt.get("dir"))
        if not dirs:
            raise ConfigError("bench=storage needs candidate directories: ckpt.dir=/mnt/a,/mnt/b (or bench.dirs=[...])")
        if self.size_mb == "auto":
            params = sum(p.numel() * p.element_size() for p in run.module.net.parameters())
            size = max(3 * params, 2**20)
        else:
            size = int(float(self.size_mb) * 2**20)
        options = run.cfg.ckpt.get("storage_options") or {}
        options = OmegaConf.to_container(options, resolve=True) if OmegaConf.is_config(options) else dict(options)
        results = [self._measure(d, size, options) for d in dirs]
        ok = [r for r in results if r.get("write_mb_per_s")]
        best = max(ok, key=lambda r: r["write_mb_per_s"]["median"]) if ok else None
        summary = {
            "schema_version": SCHEMA_VERSION,
            "run": {"bench": "storage", "model": run.cfg.model.name, "model_size": run.cfg.model.size,
                    "started": dt.datetime.fromtimestamp(run.started).isoformat(timespec="seconds"),
                    "status": "completed", "output_dir": str(run.output_dir)},
            "machine": run.machine.to_dict(),
            "storage": {"bytes": size, "repeats": self.repeats, "dirs": results,
                        "fastest": best["dir"] if best else None},
        }
        summary["bottleneck"] = diagnose(summary)
        write_summary(run.output_dir / "summary.json", summary)
        print(self.render(summary["storage"]), flush=True)
        return summary

    def _measure(self, directory: str, size: int, options: dict[str, Any]) -> dict[str, Any]:
        """One candidate's row: timings, or ``error`` (a candidate that fails is reported, not fatal)."""
        shown = redact_url(directory)
        try:
            store = CheckpointStore(directory, options)
            store.prepare(size)
        except ConfigError as err:
            return {"dir": shown, "error": str(err)}
        writes, reads = [], []
        for _ in range(self.repeats):
            name = probe_name("storage")
            try:
                writes.append(timed_write(store, name, size).seconds)
                reads.append(timed_read(store, name))
            except Exception as err:  # OSError locally; fsspec backends raise many kinds
                return {"dir": shown, "error": store._clean(f"{type(err).__name__}: {err}"),
                        "filesystem": store.describe()}
            finally:
                remove(store, name)
        mb = size / 2**20
        return {
            "dir": shown,
            "filesystem": store.describe(),
            "write_s": describe(writes),
            "read_s": describe(reads),
            "write_mb_per_s": describe(mb / w for w in writes),
            "read_mb_per_s": describe(mb / r for r in reads),
        }

    @staticmethod
    def render(storage: dict[str, Any]) -> str:
        lines = [f"checkpoint-sized file: {storage['bytes'] / 2**20:.1f} MiB x {storage['repeats']} (fsync)",
                 f"{'dir':40s} {'kind':22s} {'write MB/s med [p10,p90]':28s} {'read MB/s med':14s} {'write s med':10s}"]
        for r in storage["dirs"]:
            if "error" in r:
                lines.append(f"{r['dir']:40s} ERROR {r['error']}")
                continue
            w, rd = r["write_mb_per_s"], r["read_mb_per_s"]
            lines.append(f"{r['dir']:40s} {r['filesystem'].get('kind', '?'):22s} "
                         f"{w['median']:8.1f} [{w['p10']:.1f}, {w['p90']:.1f}]{'':6s} {rd['median']:10.1f}    "
                         f"{r['write_s']['median']:.3f}")
        if storage.get("fastest"):
            lines.append(f"fastest for checkpoints: {storage['fastest']}")
        return "\n".join(lines)
