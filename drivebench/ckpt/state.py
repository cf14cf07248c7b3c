"""What a checkpoint holds beyond Lightning's own state, so that a resumed run repeats the
uninterrupted one step for step: every RNG state (dropout masks, augmentation draws) and the data
position (epoch, batches already done in it; the datamodule's sampler skips those).

Lightning saves and restores model, optimizer, LR scheduler, loops (global step, epoch) and
callback states itself. Model-specific streaming state that lives outside ``state_dict`` (such as
SparseDrive's instance bank) is not saved: it restarts empty, as at the start of a sequence.

:class:`ResumeState` is a callback that is present in every training run (the ``Checkpointing``
callback is one; with ``ckpt=none`` a plain ``ResumeState`` is added), because a run resumed
without writing checkpoints of its own must still restore what the checkpoint carries.
"""

from __future__ import annotations

import random
import warnings
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch

STATE_KEY = "drivebench"


def rng_state() -> dict[str, Any]:
    """Every generator's state, as tensors and plain values only (loads under ``weights_only=True``,
    which is how Lightning reads a checkpoint on ``trainer.fit(ckpt_path=...)``)."""
    kind, keys, pos, has_gauss, cached_gaussian = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached_gaussian)},
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    numpy = state["numpy"]
    np.random.set_state((numpy["kind"], numpy["keys"].numpy().astype(np.uint32), numpy["pos"], numpy["has_gauss"],
                         numpy["cached_gaussian"]))
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class ResumeState(pl.Callback):
    """Puts RNG states and the data position into every checkpoint, and restores them on resume."""

    def __init__(self) -> None:
        self._data_position: tuple[int, int] = (0, 0)
        self.restored_step: int | None = None  # global step of the checkpoint this run resumed from

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        done = batch_idx + 1
        per_epoch = trainer.num_training_batches
        # where the next batch comes from; after an epoch's last batch that is the next epoch's start
        # (a resumed sampler told "epoch e, skip all of it" would skip the following epoch instead)
        if isinstance(per_epoch, int) and done >= per_epoch:
            self._data_position = (trainer.current_epoch + 1, 0)
        else:
            self._data_position = (trainer.current_epoch, done)

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        checkpoint[STATE_KEY] = {"rng": rng_state(), "data_position": self._data_position,
                                 "global_step": trainer.global_step}

    def on_load_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        state = checkpoint.get(STATE_KEY)
        if not state:
            return
        # restored before the loader's iterator exists; the train loader draws its worker seeds from
        # a generator of its own, so nothing consumes these states before the first resumed step
        set_rng_state(state["rng"])
        epoch, done = state["data_position"]
        self._data_position = (int(epoch), int(done))
        datamodule = trainer.datamodule
        if datamodule is not None and hasattr(datamodule, "resume_at"):
            datamodule.resume_at(epoch, done)
            # Lightning warns that a mid-epoch resume repeats data unless the loader is resumable;
            # this one is (the sampler skips the batches done), so the warning would mislead
            warnings.filterwarnings("ignore", message=r".*resuming from a checkpoint that ended before the epoch")
        self.restored_step = int(state.get("global_step", checkpoint.get("global_step", 0)))
