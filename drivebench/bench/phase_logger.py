"""One TensorBoard event stream per run, with the phase at the head of every tag.

Why: a run has up to three Lightning Trainers (fit, ceiling, validate), and a Trainer finalizes its
logger when it ends, which closes TensorBoard's writer: handed the run's logger as it is, each phase
wrote an event file of its own, with the same tags (``train/loss`` of the ceiling's steps beside
those of training) told apart only by the file they were in. Each Trainer gets a
:class:`PhaseLogger` instead: a view of the run's one logger that writes ``<phase>/<tag>`` and
whose ``finalize`` only flushes. The bench finalizes the run's logger once, at the end.

Tags (``docs/summary.md``): ``fit/perf/*`` (the step clock), ``fit/train/*`` (losses),
``fit/val/*`` (validation during fit), ``ceiling/perf/*`` and ``ceiling/train/*``, and
``validate/val/*`` at the step of the weights it scored.
"""

from __future__ import annotations

from argparse import Namespace
from typing import Any

from lightning.pytorch.loggers import Logger
from lightning.pytorch.utilities import rank_zero_only

FIT, CEILING, VALIDATE = "fit", "ceiling", "validate"
PHASES = (FIT, CEILING, VALIDATE)


class PhaseLogger(Logger):
    """``base`` seen by one phase: every metric is logged as ``<phase>/<name>``, at ``step + step_offset``.

    Args:
        base: the run's logger (``drivebench/conf/logger``), shared by every phase.
        phase: one of :data:`PHASES`.
        step_offset: added to every step (the end-of-run validation logs at the last training step).
    """

    def __init__(self, base: Logger, phase: str, step_offset: int = 0) -> None:
        super().__init__()
        if phase not in PHASES:
            raise ValueError(f"phase must be one of {', '.join(PHASES)}, got {phase!r}")
        self.base = base
        self.phase = phase
        self.step_offset = step_offset
        self._flush_next = False

    @property
    def name(self) -> str | None:
        return self.base.name

    @property
    def version(self) -> int | str | None:
        return self.base.version

    @property
    def save_dir(self) -> str | None:
        return self.base.save_dir

    @property
    def log_dir(self) -> str | None:
        return getattr(self.base, "log_dir", None) or self.base.save_dir

    @property
    def experiment(self) -> Any:
        return self.base.experiment

    @rank_zero_only
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        tagged = {f"{self.phase}/{key}": value for key, value in metrics.items()}
        self.base.log_metrics(tagged, None if step is None else step + self.step_offset)
        if self._flush_next:
            self._flush_next = False
            self.flush()

    @rank_zero_only
    def flush(self, then_next: bool = False) -> None:
        """Write what was logged to the event file now (a kill loses only what the process still buffers).
        ``then_next``: also flush right after the next ``log_metrics``: a checkpoint is taken in
        ``on_train_batch_end``, before Lightning logs that step's losses, which belong to it too."""
        flush = getattr(self.base.experiment, "flush", None)
        if callable(flush):
            flush()
        self._flush_next = then_next

    @rank_zero_only
    def log_hyperparams(self, params: dict[str, Any] | Namespace, *args: Any, **kwargs: Any) -> None:
        self.base.log_hyperparams(params, *args, **kwargs)

    @rank_zero_only
    def log_graph(self, model: Any, input_array: Any = None) -> None:
        self.base.log_graph(model, input_array)

    @rank_zero_only
    def save(self) -> None:
        self.base.save()

    @rank_zero_only
    def finalize(self, status: str) -> None:
        """The phase's Trainer ended: flush what it logged, keep the run's stream open for the next phase."""
        self.base.save()
        flush = getattr(self.base.experiment, "flush", None)
        if callable(flush):
            flush()


def phase_logger(base: Logger | bool | None, phase: str, step_offset: int = 0) -> PhaseLogger | bool:
    """The Trainer's ``logger`` argument for ``phase``: a :class:`PhaseLogger`, or ``False`` without a logger."""
    if not isinstance(base, Logger):
        return False
    return PhaseLogger(base, phase, step_offset)
