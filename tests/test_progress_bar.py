"""The console bar counts optimizer steps of the whole phase (step N/max_steps), not batches of each epoch."""

from __future__ import annotations

import io

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.demos.boring_classes import BoringModel
from torch.utils.data import DataLoader, TensorDataset

from drivebench.perf.progress import StepProgressBar

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class FourBatches(BoringModel):
    def train_dataloader(self) -> DataLoader:
        return DataLoader(TensorDataset(torch.randn(8, 32)), batch_size=2)  # 4 batches per epoch

    def training_step(self, batch, batch_idx):
        return super().training_step(batch[0], batch_idx)


def _fit(tmp_path, bar: StepProgressBar, **kwargs) -> pl.Trainer:
    trainer = pl.Trainer(accelerator="cpu", callbacks=[bar], logger=False, enable_checkpointing=False,
                         enable_model_summary=False, limit_val_batches=0, default_root_dir=tmp_path, **kwargs)
    trainer.fit(FourBatches())
    return trainer


def test_one_bar_over_every_epoch_of_a_bounded_run(tmp_path, capsys) -> None:
    bar = StepProgressBar()
    trainer = _fit(tmp_path, bar, max_steps=10, max_epochs=-1)  # 2.5 epochs, Lightning's bar: "Epoch 2/-2"
    assert trainer.global_step == 10
    tqdm = bar.train_progress_bar
    assert (tqdm.n, tqdm.total) == (10, 10) and tqdm.desc.startswith("train step")
    out = capsys.readouterr().out
    assert "10/10" in out and "epoch=2" in out and "/-2" not in out and "Epoch" not in out


def test_an_epoch_schedule_counts_its_epochs_batches_and_the_phase_names_the_bar(tmp_path, capsys) -> None:
    bar = StepProgressBar(phase="ceiling")
    _fit(tmp_path, bar, max_epochs=2)  # trainer=full: max_steps=-1, the epochs bound the fit
    assert (bar.train_progress_bar.n, bar.train_progress_bar.total) == (8, 8)
    assert "ceiling step" in capsys.readouterr().out
