"""The validation loader's workers: kept for the whole fit when it validates every epoch (trainer=full), so each
validation does not fork them again; a standalone validation (a benchmark's, once) does not keep them."""

from __future__ import annotations

import os
from pathlib import Path

import lightning.pytorch as pl
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from torch.utils.data import Dataset

from drivebench.accel.settings import AccelSettings
from drivebench.data.datamodule import DriveDataModule
from drivebench.lit.base import DriveModule
from drivebench.perf import machine as M

from dataset_source import DatasetSource

CONF = Path(__file__).resolve().parents[1] / "drivebench" / "conf"


class PidReport(Dataset):
    """Each sample carries the pid of the process that loaded it (a loader worker)."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> dict:
        return {"x": torch.ones(2), "pid": os.getpid()}


class ValPids(DriveModule):
    """Records the worker pids of every validation batch, per validation."""

    def __init__(self) -> None:
        super().__init__(torch.nn.Linear(2, 1), optimizer=lambda p: torch.optim.SGD(p, lr=0.1))
        self.validations: list[set[int]] = []

    def on_validation_epoch_start(self) -> None:
        super().on_validation_epoch_start()
        self.validations.append(set())

    def compute_loss(self, batch, outputs):
        if not self.training:
            self.validations[-1].update(batch["pid"].tolist())
        return {"loss": outputs.pow(2).mean()}

    def forward(self, batch):
        return self.net(batch["x"])

    def batch_size(self, batch):
        return batch["x"].shape[0]


def _datamodule() -> DriveDataModule:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["accel=max", "accel.num_workers=2",
                                                       "accel.prefetch_across_epochs=false"])
    machine = M.detect_machine("cpu")
    accel = AccelSettings.resolve(OmegaConf.to_container(cfg.accel, resolve=True), machine, processes=1)
    assert accel.persistent_workers and accel.num_workers == 2
    return DriveDataModule(DatasetSource(PidReport()), None, None, batch_size=4, val_batch_size=2, accel=accel,
                           progress=False)


def _trainer(**kwargs) -> pl.Trainer:
    return pl.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, num_sanity_val_steps=0, **kwargs)


def test_a_fit_that_validates_every_epoch_keeps_its_validation_workers():
    dm, module = _datamodule(), ValPids()
    trainer = _trainer(max_epochs=3, check_val_every_n_epoch=1)
    trainer.fit(module, datamodule=dm)
    assert len(module.validations) == 3
    assert len(module.validations[0]) == 2  # both workers loaded validation batches
    assert module.validations[0] == module.validations[1] == module.validations[2]  # the same processes
    assert trainer.val_dataloaders.persistent_workers


def test_a_standalone_validation_does_not_keep_its_workers():
    dm, module = _datamodule(), ValPids()
    trainer = _trainer(max_epochs=1)
    trainer.validate(module, datamodule=dm, verbose=False)
    trainer.validate(module, datamodule=dm, verbose=False)
    assert not trainer.val_dataloaders.persistent_workers
    assert len(module.validations) == 2 and module.validations[0].isdisjoint(module.validations[1])  # forked anew
