"""The console progress bar of a phase: optimizer step N of the phase's total, across epochs.

Why: a bounded benchmark trains ``max_steps`` with ``max_epochs=-1`` over as many passes of a small
set as it takes, and Lightning's own bar restarts at every epoch and shows ``Epoch 4/-2``. This bar
(a ``TQDMProgressBar``, the callbacks group's ``progress_bar`` entry) counts ``trainer.global_step``
against ``trainer.estimated_stepping_batches`` (``max_steps``, or the epochs' batches with
``trainer=full``), names the phase and keeps the epoch in its postfix. Validation bars are Lightning's.
"""

from __future__ import annotations

import math
import sys
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm, _update_n


class StepProgressBar(TQDMProgressBar):
    """Args:
        phase: the bar's label (``train``; the ceiling phase sets ``ceiling``).
        refresh_rate: update the bar every this many steps (0: disabled).
    """

    def __init__(self, phase: str = "train", refresh_rate: int = 1, process_position: int = 0) -> None:
        super().__init__(refresh_rate=refresh_rate, process_position=process_position, leave=False)
        self.phase = phase

    @staticmethod
    def total_steps(trainer: pl.Trainer) -> int | None:
        """The optimizer steps this fit ends at (None: unbounded, e.g. ``max_time`` alone)."""
        total = trainer.estimated_stepping_batches
        return int(total) if total is not None and math.isfinite(total) else None

    @property
    def train_description(self) -> str:
        return f"{self.phase} step"

    def init_train_tqdm(self) -> Tqdm:
        trainer = self.trainer
        return Tqdm(desc=self.train_description, total=self.total_steps(trainer),
                    initial=trainer.global_step,  # a resumed run starts where it stopped
                    position=2 * self.process_position, disable=self.is_disabled, leave=True, dynamic_ncols=True,
                    file=sys.stdout, smoothing=0, bar_format=self.BAR_FORMAT)

    def on_train_start(self, trainer: pl.Trainer, *_: Any) -> None:
        self.train_progress_bar = self.init_train_tqdm()

    def on_train_epoch_start(self, trainer: pl.Trainer, *_: Any) -> None:
        pass  # one bar for the whole phase: nothing restarts at an epoch boundary

    def get_metrics(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, Any]:
        metrics = super().get_metrics(trainer, pl_module)
        metrics.pop("v_num", None)  # the run directory names the run
        return {"epoch": trainer.current_epoch, **metrics}

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        n = trainer.global_step
        bar = self.train_progress_bar
        if bar is not None and self._should_update(n, bar.total or n):
            _update_n(bar, n)
            bar.set_postfix(self.get_metrics(trainer, pl_module))

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self.train_progress_bar.disable:
            self.train_progress_bar.set_postfix(self.get_metrics(trainer, pl_module))
