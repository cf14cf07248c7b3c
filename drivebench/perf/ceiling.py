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


CANDIDATES = 5  # batches the ceiling draws to pick its resident one from (a few loader batches: seconds at most)


def representative_batch(loader: Any, target_elements: float | None,
                         candidates: int = CANDIDATES) -> tuple[Any, dict[str, Any]]:
    """The batch, of the first ``candidates`` that ``loader`` yields, whose tensor elements are closest
    to ``target_elements`` (training's median batch; None: the candidates' median), and what was chosen.

    Why: batches of scenes vary in size (QCNet: agents and lanes; on the CPU the elements of a batch
    span 0.7-1.3x their median, and a step's compute follows them, Pearson r = 0.89 over 24 steps), so a
    ceiling on whichever batch comes first could be a quarter heavier or lighter than training's typical
    step, and the efficiency off by as much. The loader's iterator is closed before
    the ceiling steps, so its workers do not prefetch beside it."""
    from drivebench.perf.callback import batch_elements

    iterator = iter(loader)
    drawn: list[tuple[int, Any]] = []
    try:
        for _ in range(max(candidates, 1)):
            try:
                batch = next(iterator)
            except StopIteration:
                break
            drawn.append((batch_elements(batch), batch))
    finally:
        for owner in (iterator, loader):  # a generator, then the EpochStream that holds the workers
            close = getattr(owner, "close", None) or getattr(owner, "_shutdown_workers", None)
            if callable(close):
                close()
        del iterator
    if not drawn:
        raise RuntimeError("the training loader yielded no batch for the ceiling")
    sizes = sorted(e for e, _ in drawn)
    target = float(target_elements) if target_elements else float(sizes[len(sizes) // 2])
    elements, batch = min(drawn, key=lambda item: abs(item[0] - target))
    return batch, {"elements": elements, "target_elements": target, "candidates": len(drawn),
                   "candidates_elements": [e for e, _ in drawn]}


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
