"""``accel.gc_freeze``: take the long-lived heap out of Python's cyclic garbage collector.

Why: after set-up the training process holds hundreds of thousands of long-lived objects (devkit
tables, sample indexes, annotation dicts). Every full (generation-2) collection walks all of them;
on the MapTR benchmark that was a single 0.9 s step in a run of 0.12 s steps. ``gc.freeze()``
moves everything alive into a permanent generation that collections skip, which the Python docs
also recommend before forking workers (fewer copy-on-write page faults). Objects made later are
collected as usual; ``on_train_end`` unfreezes so that later phases can free the heap again.

The warm-up steps make a second long-lived heap: a compile's graphs and caches (at the first step,
or under ``accel=auto`` after the trial), the trial's records. So the heap is frozen again at the
end of the step timer's warm-up (the last step before the measured ones), and the full collections
that still happen during training are counted (``gen2_collections``, ``gen2_s``; ``gen2_measured_*``, those
after the last freeze: the measured steps'; b42's ``accel=auto`` runs had 16-18 full collections against
``max``'s 4-5, most of them in the trial and the compile): a GaussianFormer
``accel=auto`` run on an H100 had one 1.1-s step among its ~0.39-s measured steps after compiling at
step 91 (b41).
"""

from __future__ import annotations

import gc
import time
from typing import TYPE_CHECKING, Any

import lightning.pytorch as pl

if TYPE_CHECKING:
    from drivebench.perf.callback import StepTimer

FULL = 2  # the generation of a full collection


class FreezeHeap(pl.Callback):
    """Collect once, then freeze, at train start and again at the last warm-up step of ``timer``; unfreeze
    at train end. Put it before the step timer in the callback list: the first collection then falls before
    the first step, the second into the last warm-up step (both outside the measured steps).

    Args:
        timer: the phase's step timer, read for its warm-up; ``None``: frozen at train start only.
    """

    def __init__(self, timer: StepTimer | None = None) -> None:
        self.timer = timer
        self.frozen_objects = 0
        self.collect_s = 0.0
        self.refrozen: list[dict[str, float | int]] = []  # each freeze after a warm-up: step, objects, seconds
        self.gen2_collections = 0
        self.gen2_s = 0.0
        self.gen2_max_s = 0.0
        self._gen2_started: float | None = None
        self._gen2_at_refreeze = (0, 0.0)  # the counts when the heap was last frozen at a warm-up's end
        self._training = False

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.collect_s, self.frozen_objects = self._freeze()
        self._training = True
        if self._count_full not in gc.callbacks:
            gc.callbacks.append(self._count_full)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        if self.timer is None:
            return
        step = len(self.timer.times.records)  # this step's index: the timer records it after this callback
        if step == self.timer.warmup_steps - 1:  # each step ends once: one freeze per warm-up end
            seconds, objects = self._freeze()
            self.refrozen.append({"step": step, "objects": objects, "collect_s": seconds})
            self._gen2_at_refreeze = (self.gen2_collections, self.gen2_s)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._training = False
        if self._count_full in gc.callbacks:
            gc.callbacks.remove(self._count_full)
        gc.unfreeze()

    def summary(self) -> dict[str, Any]:
        count, seconds = self._gen2_at_refreeze
        return {"frozen_objects": self.frozen_objects, "collect_s": self.collect_s, "refrozen": self.refrozen,
                "gen2_collections": self.gen2_collections, "gen2_s": self.gen2_s, "gen2_max_s": self.gen2_max_s,
                "gen2_measured_collections": self.gen2_collections - count, "gen2_measured_s": self.gen2_s - seconds}

    # ---- helpers -------------------------------------------------------------------------------
    def _freeze(self) -> tuple[float, int]:
        """One full collection (not counted as the run's), then everything alive frozen."""
        training, self._training = self._training, False
        t0 = time.perf_counter()
        gc.collect()
        gc.freeze()
        self._training = training
        return time.perf_counter() - t0, gc.get_freeze_count()

    def _count_full(self, phase: str, info: dict[str, Any]) -> None:
        """``gc.callbacks`` hook: the full collections Python starts on its own during training."""
        if info.get("generation") != FULL or not self._training:
            return
        if phase == "start":
            self._gen2_started = time.perf_counter()
        elif self._gen2_started is not None:
            seconds = time.perf_counter() - self._gen2_started
            self._gen2_started = None
            self.gen2_collections += 1
            self.gen2_s += seconds
            self.gen2_max_s = max(self.gen2_max_s, seconds)
