"""The run's summary as it stands when training starts (``run.status: running``), on disk before the long work.

Why: a run that ends without writing its final summary (SIGKILL after a scheduler's grace, the OOM killer, a
lost node) otherwise leaves only TensorBoard files, and the report cannot place them (which machine, model,
setting, seed). QCNet on an H100 (b44): a convergence run killed 5 s after its SIGTERM had crossed its quality
target at epoch 3 and was left out of the ratio. With this summary on disk the report lists such a run as one
that died and follows the validation it logged, as it does for a run a signal stopped. The final summary
(completed, interrupted or failed) replaces it.

Both keep ``run.schedule_steps``, the optimizer steps the fit is scheduled for, set here: a run a cap stopped or
killed after its last scheduled step and validation (as b48's three SparseDrive runs were, on an H100, in their
end-of-run validation) has finished its schedule, and the report counts its last validation as its final metric.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import lightning.pytorch as pl

from drivebench.perf.summary import write_summary


class RunningSummary(pl.Callback):
    """Writes ``summary`` (status ``running``) to ``path`` on rank 0 when training starts; ``written`` says
    whether it did, so that a failure later can mark that file ``failed`` rather than leave it ``running``."""

    def __init__(self, path: Path, summary: dict[str, Any]) -> None:
        self.path = path
        self.summary = summary
        self.written = False

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.summary.setdefault("run", {})["schedule_steps"] = scheduled_steps(trainer)
        if trainer.is_global_zero and not self.written:
            write_summary(self.path, self.summary)  # its run.status is RUNNING until the bench finishes it
            self.written = True


def scheduled_steps(trainer: pl.Trainer) -> int | None:
    """The optimizer steps the fit is scheduled for (Lightning's estimate from ``max_steps``, ``max_epochs``, the
    batches per epoch and gradient accumulation); None for an open-ended schedule."""
    steps = trainer.estimated_stepping_batches
    return int(steps) if math.isfinite(steps) else None
