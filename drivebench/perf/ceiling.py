"""The ceiling: the same model stepping on one batch that already sits on the device, no loader.

Real throughput divided by ceiling throughput is the run's efficiency: how much of what the model
could do on this machine the input pipeline lets it do. The ceiling is a datamodule of its own: it
hands the trainer the same host batch ``steps`` times, copies it to the device and puts it through
the run's device transform once (timed on the step clock like any batch), then returns that device
batch at every later step.
"""

from __future__ import annotations

from typing import Any, Iterator

import torch

from drivebench.data.device_transfer import DeviceTransferDataModule, DeviceTransform


class _SameBatch:
    """``steps`` references to one batch (an iterable, not a list: Lightning reads a list as a
    collection of loaders)."""

    def __init__(self, batch: Any, steps: int) -> None:
        self.batch, self.steps = batch, steps

    def __len__(self) -> int:
        return self.steps

    def __iter__(self) -> Iterator[Any]:
        for _ in range(self.steps):
            yield self.batch


class CeilingDataModule(DeviceTransferDataModule):
    """Args:
        host_batch: one batch as the run's training loader yields it (on the host).
        steps: how many training steps the ceiling phase takes.
        device_transform: the run's device transform (``DriveDataModule.device_transform``).
    """

    def __init__(self, host_batch: Any, steps: int, device_transform: DeviceTransform | None = None) -> None:
        super().__init__(device_transform)
        if steps < 1:
            raise ValueError(f"the ceiling needs at least one step, got {steps}")
        self.host_batch = host_batch
        self.steps = steps
        self.resident: Any = None  # the batch on the device, transformed
        self._device: torch.device | None = None

    def train_dataloader(self) -> _SameBatch:
        return _SameBatch(self.host_batch, self.steps)

    def val_dataloader(self) -> list:
        """No validation batches: the ceiling only steps (its trainer sets ``limit_val_batches=0``, so
        Lightning never asks). Defined so that the model's ``validation_step`` meets a datamodule that
        says it has no validation, instead of one Lightning warns lacks a ``val_dataloader``."""
        return []

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        if self.resident is None or self._device != device:
            moved = super().transfer_batch_to_device(batch, device, dataloader_idx)
            self.resident = super().on_after_batch_transfer(moved, dataloader_idx)
            self._device = device
        return self.resident

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        return batch  # transformed once, in transfer_batch_to_device
