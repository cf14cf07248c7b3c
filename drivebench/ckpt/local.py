"""Checkpoints on a filesystem path: atomic (temp file + rename), timed, pruned to the last k.

Every save is timed as blocking time (how long training stood still); the timing goes into the
step clock (``SPANS`` "ckpt", reported separately from data wait) and into ``self.saves``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl

from drivebench.errors import ConfigError
from drivebench.perf.spans import SPANS


class LocalCheckpoints(pl.Callback):
    """Args:
        dir: target directory (created if missing; must be writable).
        every_n_steps: save every N optimizer steps (None: only at the end of training).
        save_last: also save at the end of training as ``last.ckpt``.
        keep_last_k: step checkpoints kept (older ones are deleted after a newer one is complete).
    """

    def __init__(self, dir: str, every_n_steps: int | None = None, save_last: bool = True, keep_last_k: int = 1) -> None:
        if every_n_steps is not None and every_n_steps < 1:
            raise ConfigError(f"ckpt.every_n_steps={every_n_steps} is not valid; use a whole number >= 1 or null")
        if keep_last_k < 0:
            raise ConfigError(f"ckpt.keep_last_k={keep_last_k} is not valid; use a whole number >= 0")
        self.dir = Path(dir)
        self.every_n_steps = every_n_steps
        self.save_last = save_last
        self.keep_last_k = keep_last_k
        self.saves: list[dict[str, Any]] = []
        self._kept: list[Path] = []

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise ConfigError(f"ckpt.dir={self.dir} cannot be created ({err.strerror}); choose a writable directory "
                              "or ckpt=none") from err
        if not os.access(self.dir, os.W_OK):
            raise ConfigError(f"ckpt.dir={self.dir} is not writable; choose a writable directory or ckpt=none")

    def _save(self, trainer: pl.Trainer, name: str) -> Path:
        final = self.dir / name
        tmp = self.dir / f".{name}.partial"
        t0 = time.perf_counter()
        with SPANS.span("ckpt"):
            trainer.save_checkpoint(tmp)
            if trainer.is_global_zero:
                os.replace(tmp, final)
        elapsed = time.perf_counter() - t0
        size = final.stat().st_size if final.exists() else 0
        self.saves.append({"step": trainer.global_step, "path": str(final), "blocking_s": elapsed, "write_s": elapsed,
                           "bytes": size, "mb_per_s": size / 2**20 / elapsed if elapsed > 0 else None})
        return final

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self.every_n_steps and trainer.global_step % self.every_n_steps == 0:
            path = self._save(trainer, f"step-{trainer.global_step:08d}.ckpt")
            self._kept.append(path)
            while len(self._kept) > self.keep_last_k:
                old = self._kept.pop(0)
                if trainer.is_global_zero:
                    old.unlink(missing_ok=True)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.save_last:
            self._save(trainer, "last.ckpt")

    def summary(self) -> dict[str, Any]:
        from drivebench.perf.machine import filesystem_of
        from drivebench.perf.stats import describe

        return {
            "dir": str(self.dir),
            "filesystem": filesystem_of(self.dir),
            "saves": len(self.saves),
            "blocking_s": describe(s["blocking_s"] for s in self.saves),
            "bytes": self.saves[-1]["bytes"] if self.saves else None,
            "mb_per_s": describe(s["mb_per_s"] for s in self.saves if s["mb_per_s"]),
            "each": self.saves,
        }
