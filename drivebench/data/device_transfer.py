"""The last leg of a batch's way to the step: the copy to the device and the device transform.

Why on the datamodule: the device transform (GPU JPEG decode, photometric distortion, normalise;
mmdet3d's data_preprocessor) belongs to the data pipeline, not to the model, and Lightning calls a
datamodule's batch-transfer hooks (``on_before_batch_transfer``, ``transfer_batch_to_device``,
``on_after_batch_transfer``) for every batch of a ``fit`` or ``validate`` that was given it, so the
LightningModule keeps only the model, its loss, metrics and optimisation. The hooks record into
the step clock of the trainer's :class:`~drivebench.perf.callback.StepTimer` (the fetch, ``h2d``,
``gpu_preprocess``); without a timer the clock is off and they only move and transform.
"""

from __future__ import annotations

from typing import Any, Callable

import lightning.pytorch as pl
import torch
from lightning.fabric.utilities.apply_func import move_data_to_device

from drivebench.data.device_prefetch import READY_KEY
from drivebench.perf.clock import FETCHED, GPU_PREPROCESS, H2D, StepClock

DeviceTransform = Callable[[Any], Any]


def move_batch(batch: Any, device: torch.device) -> Any:
    """Host batch -> device batch; ``img_jpeg`` stays on the host (also used by the prefetch thread)."""
    # JPEG bytes are read by the decoder on the host (nvjpeg takes host buffers): copying them to the
    # device only to copy them back would cost a blocking device-to-host copy each
    if not (isinstance(batch, dict) and "img_jpeg" in batch):
        return move_data_to_device(batch, device)
    moved = move_data_to_device({k: v for k, v in batch.items() if k != "img_jpeg"}, device)
    moved["img_jpeg"] = batch["img_jpeg"]
    return moved


class DeviceTransferDataModule(pl.LightningDataModule):
    """A datamodule whose batches are copied with :func:`move_batch`, then put through
    ``device_transform`` on the device, each timed on the step clock.

    Args:
        device_transform: optional callable run on the batch once it is on the device (timed as
            ``gpu_preprocess``). Batches that a :class:`~drivebench.data.device_prefetch.DevicePrefetchLoader`
            already moved and transformed (``READY_KEY``) pass through untouched.
    """

    def __init__(self, device_transform: DeviceTransform | None = None) -> None:
        super().__init__()
        self.device_transform = device_transform
        self.step_clock = StepClock()  # off until a StepTimer hands over its own

    def use_step_clock(self, clock: StepClock | None) -> None:
        self.step_clock = clock if clock is not None else StepClock()

    def move_batch(self, batch: Any, device: torch.device) -> Any:
        return move_batch(batch, device)

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        self.step_clock.mark(FETCHED)
        return batch

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        if isinstance(batch, dict) and batch.get(READY_KEY):  # moved and transformed by the prefetch thread
            return batch
        with self.step_clock.span(H2D):
            return self.move_batch(batch, device)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        if isinstance(batch, dict) and batch.pop(READY_KEY, False):
            return batch
        if self.device_transform is None:
            return batch
        with self.step_clock.span(GPU_PREPROCESS):
            return self.device_transform(batch)
