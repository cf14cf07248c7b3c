"""What a checkpoint holds beyond Lightning's own state, so that a resumed run repeats the
uninterrupted one step for step: every RNG state (dropout masks, augmentation draws).

Lightning saves and restores model, optimizer, LR scheduler, loops (global step, epoch, and the
training loader's position: the loader is stateful, see :mod:`drivebench.data.epoch_stream`) and
callback states itself. The RNG states are such a callback state (:class:`RngState`, under
``checkpoint["callbacks"]["RngState"]``). Model-specific streaming state that lives outside
``state_dict`` (such as SparseDrive's instance bank) is not saved: it restarts empty, as at the
start of a sequence.

:class:`RngState` is present in every training run, with or without checkpoints of its own,
because a run resumed from another run's checkpoint must still restore what the checkpoint carries.
"""

from __future__ import annotations

import random
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch

LEGACY_KEY = "drivebench"  # where checkpoints written before the stateful loader kept RNG and data position


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


class RngState(pl.Callback):
    """Puts every RNG state into each checkpoint (Lightning's callback ``state_dict``), and restores
    them on resume."""

    def state_dict(self) -> dict[str, Any]:
        return {"rng": rng_state()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # restored before the loader's iterator exists; the train loader draws its worker seeds from
        # a generator of its own, so nothing consumes these states before the first resumed step
        set_rng_state(state_dict["rng"])

    def on_load_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        """A checkpoint written before the loader was stateful kept RNG and data position under ``drivebench``:
        restore its RNG states and hand its data position to Lightning's loop state, where the
        stateful loader reads it (Lightning restores the loops after the callbacks)."""
        legacy = checkpoint.get(LEGACY_KEY)
        if not legacy or self.state_key in checkpoint.get("callbacks", {}):
            return
        set_rng_state(legacy["rng"])
        fit_loop = checkpoint.get("loops", {}).get("fit_loop", {}).setdefault("state_dict", {})
        if "data_position" in legacy and "combined_loader" not in fit_loop:
            epoch, done = legacy["data_position"]
            fit_loop["combined_loader"] = [{"epoch": int(epoch), "batches_done": int(done)}]
