"""The Checkpointing trigger and the StorageCheckpointIO plugin inside small in-process Lightning
fits: triggers, pruning, remote (``memory://``) stores, asynchronous writes and their failures,
resume (Lightning restoring the stateful loader and the RNG callback), and what gets logged.

``memory://`` filesystems live in one process only, which is why these run in-process.
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.loggers.logger import Logger
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from drivebench.ckpt.callback import Checkpointing
from drivebench.ckpt.checkpoint_io import LOCK_NAME, StorageCheckpointIO
from drivebench.ckpt.state import RngState
from drivebench.ckpt.store import CheckpointStore, CheckpointWriteError, checkpoint_name, step_of
from drivebench.data.epoch_stream import EpochStream
from drivebench.data.sampling import RandomBatchSampler
from drivebench.errors import ConfigError
from drivebench.perf.callback import StepTimer
from test_ckpt_cli_helpers import loader_position

SAMPLES, BATCH = 48, 8  # 6 batches per epoch


class Toy(pl.LightningModule):
    """A regression net with dropout: resuming it exactly needs the RNG state, not only weights."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Dropout(0.5), nn.Linear(32, 1))
        self.losses: dict[int, float] = {}
        self.batches_seen: list[list[float]] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.mse_loss(self.net(x), y)
        self.losses[self.global_step] = loss.item()
        self.batches_seen.append(x[:, 0].tolist())
        return loss

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.AdamW(self.parameters(), lr=1e-2)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.9)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class ToyData(pl.LightningDataModule):
    """Seeded sample order through drivebench's stateful training loader: Lightning resumes it mid-epoch."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(123)
        self.x = torch.randn(SAMPLES, 4, generator=g)
        self.y = self.x.sum(1, keepdim=True) + 0.1 * torch.randn(SAMPLES, 1, generator=g)

    def train_dataloader(self) -> EpochStream:
        dataset = TensorDataset(self.x, self.y)
        return EpochStream(RandomBatchSampler(SAMPLES, BATCH, seed=0),
                           lambda batches: DataLoader(dataset, batch_sampler=batches,
                                                      generator=torch.Generator().manual_seed(0)),
                           keyed=False, across_epochs=False)


class RecordingLogger(Logger):
    def __init__(self) -> None:
        super().__init__()
        self.metrics: list[tuple[int, dict[str, float]]] = []

    @property
    def name(self) -> str:
        return "recording"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.metrics.append((step, dict(metrics)))

    def series(self, tag: str) -> dict[int, float]:
        return {step: m[tag] for step, m in self.metrics if tag in m}


def checkpointing(dir: str, keep_last_k: int = 2, async_write: bool = False,
                  storage_options: dict[str, Any] | None = None, **triggers: Any) -> Checkpointing:
    """The trigger with its IO (``ckpt.io``), as the runners build them; the IO is ``.io`` before setup too."""
    ckpt = Checkpointing(**triggers)
    ckpt.io = StorageCheckpointIO(dir, keep_last_k=keep_last_k, async_write=async_write,
                                  storage_options=storage_options)
    return ckpt


def trainer_for(tmp_path: Path, ckpt: Checkpointing | None, callbacks: list[pl.Callback] = (),
                **kwargs: Any) -> pl.Trainer:
    """A CPU Trainer with the trigger, the RNG callback and the IO as a plugin (the runners' set-up)."""
    kwargs.setdefault("max_epochs", -1)
    kwargs.setdefault("limit_val_batches", 0)
    return pl.Trainer(accelerator="cpu", devices=1, logger=kwargs.pop("logger", False),
                      callbacks=[*callbacks, RngState(), *([ckpt] if ckpt is not None else [])],
                      plugins=[ckpt.io if ckpt is not None else StorageCheckpointIO(None)],
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      use_distributed_sampler=False, num_sanity_val_steps=0,
                      default_root_dir=str(tmp_path), **kwargs)


def fit(tmp_path: Path, ckpt: Checkpointing | None, max_steps: int, ckpt_path: str | None = None,
        logger: Logger | bool = False, **trainer_kwargs: Any) -> tuple[Toy, pl.Trainer]:
    pl.seed_everything(7, verbose=False)
    module, data = Toy(), ToyData()
    trainer = trainer_for(tmp_path, ckpt, max_steps=max_steps, logger=logger, **trainer_kwargs)
    trainer.fit(module, datamodule=data, ckpt_path=ckpt_path)  # a remote path: read by the IO
    return module, trainer


@pytest.fixture
def bucket() -> str:
    """A fresh memory:// URL (the memory filesystem is shared by the whole process)."""
    return f"memory://bucket-{uuid.uuid4().hex[:8]}/run"


def test_remote_memory_store_writes_lists_prunes_and_finds_latest(tmp_path, bucket):
    ckpt = checkpointing(bucket, every_n_steps=2, keep_last_k=2)
    fit(tmp_path, ckpt, max_steps=7)
    assert [s["step"] for s in ckpt.io.saves] == [2, 4, 6, 7]  # 7: save_last
    store = CheckpointStore(bucket)
    assert [step for step, _ in store.list_steps()] == [6, 7]  # pruned to keep_last_k after each save
    latest = store.latest_complete()
    assert latest == f"memory:///{bucket.split('://')[1]}/{checkpoint_name(7)}" == ckpt.io.saves[-1]["path"]
    state = store.load(latest)
    assert state["global_step"] == 7 and "rng" in state["callbacks"]["RngState"]
    assert set(state) >= {"state_dict", "optimizer_states", "lr_schedulers", "loops", "callbacks"}
    assert loader_position(state) == (1, 1)  # 6 batches per epoch: the next batch is epoch 1's second
    assert ckpt.summary()["filesystem"]["kind"] == "fsspec:memory"

    # an object under a final name that does not load (a foreign upload, say) is skipped
    store._fs.pipe(f"{store._root}/{checkpoint_name(9)}", b"not a checkpoint")
    assert store.latest_complete() == latest


def test_resume_from_memory_url_repeats_the_uninterrupted_run(tmp_path, bucket):
    straight, _ = fit(tmp_path, checkpointing(bucket, every_n_steps=3, keep_last_k=0), max_steps=10)
    first = f"{bucket}/{checkpoint_name(3)}"
    assert CheckpointStore(bucket).exists(first)
    resumed, trainer = fit(tmp_path, checkpointing(f"{bucket}-resumed", every_n_steps=3), max_steps=10,
                           ckpt_path=first)
    # steps 3..9 cross the epoch boundary at 6: same batches, same dropout masks, same schedule
    assert sorted(resumed.losses) == list(range(3, 10))
    assert resumed.losses == {s: straight.losses[s] for s in range(3, 10)}  # exact, not approximate
    assert resumed.batches_seen == straight.batches_seen[3:]
    for a, b in zip(resumed.parameters(), straight.parameters()):
        assert torch.equal(a, b)
    assert trainer.global_step == 10


def test_async_writes_happen_on_a_background_thread_and_are_complete(tmp_path):
    ckpt = checkpointing(str(tmp_path / "ckpt"), every_n_steps=2, keep_last_k=0, async_write=True)
    threads: list[str] = []
    real_write = ckpt.io.store.write

    def slow_write(name: str, checkpoint: dict[str, Any], fault: Any = None) -> Any:
        threads.append(threading.current_thread().name)
        time.sleep(0.05)
        return real_write(name, checkpoint, fault)

    ckpt.io.store.write = slow_write
    logger = RecordingLogger()
    fit(tmp_path, ckpt, max_steps=6, logger=logger)
    assert threads and all(name.startswith("drivebench-ckpt") for name in threads)
    assert [s["step"] for s in ckpt.io.saves] == [2, 4, 6]
    for step, path in ckpt.io.store.list_steps():
        state = ckpt.io.store.load(path)
        assert state["global_step"] == step
    for save in ckpt.io.saves:
        assert save["async"] and save["blocking_s"] > 0 and save["write_s"] > 0 and save["bytes"] > 0
    # each save's figures are logged under the step it was taken at, once the write has completed
    assert sorted(logger.series("perf/ckpt_write_s")) == [2, 4, 6]
    assert sorted(logger.series("perf/ckpt_blocking_s")) == [2, 4, 6]


def test_async_checkpoint_is_a_snapshot_not_the_live_weights(tmp_path):
    """Training goes on while the background thread writes: the file must hold the weights of the
    step it was taken at."""
    ckpt = checkpointing(str(tmp_path / "ckpt"), every_n_steps=2, keep_last_k=0, async_write=True, save_last=False)
    release = threading.Event()
    real_write = ckpt.io.store.write
    snapshots: dict[int, dict[str, torch.Tensor]] = {}

    def gated_write(name: str, checkpoint: dict[str, Any], fault: Any = None) -> Any:
        release.wait(timeout=10)  # let training run on (and change the weights) before writing
        return real_write(name, checkpoint, fault)

    class Snapshot(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if trainer.global_step == 2:
                snapshots[2] = {k: v.clone() for k, v in pl_module.state_dict().items()}
            if trainer.global_step == 3:
                release.set()

    ckpt.io.store.write = gated_write
    pl.seed_everything(7, verbose=False)
    trainer = trainer_for(tmp_path, ckpt, callbacks=[Snapshot()], max_steps=3)
    trainer.fit(Toy(), datamodule=ToyData())
    saved = ckpt.io.store.load(str(tmp_path / "ckpt" / checkpoint_name(2)))["state_dict"]
    for key, value in snapshots[2].items():
        assert torch.equal(saved[key], value), key


class FailingStore(CheckpointStore):
    """A store whose writes fail from a given step on (as a full or unreachable disk would)."""

    def __init__(self, directory: str, fail_from_step: int) -> None:
        super().__init__(directory)
        self.fail_from_step = fail_from_step

    def write(self, name: str, checkpoint: dict[str, Any], fault: Any = None) -> Any:
        if step_of(name) >= self.fail_from_step:
            raise CheckpointWriteError(f"writing checkpoint {name} failed: test; the previous checkpoint is intact")
        return super().write(name, checkpoint, fault)


def test_failed_background_write_is_raised_at_the_next_save(tmp_path):
    ckpt = checkpointing(str(tmp_path / "ckpt"), every_n_steps=2, async_write=True)
    ckpt.io.store = FailingStore(str(tmp_path / "ckpt"), fail_from_step=4)
    seen: dict[str, Any] = {}

    class Watch(pl.Callback):
        def on_exception(self, trainer, pl_module, exception):
            seen["step"] = trainer.global_step

    pl.seed_everything(7, verbose=False)
    trainer = trainer_for(tmp_path, ckpt, callbacks=[Watch()], max_steps=20)
    with pytest.raises(CheckpointWriteError, match=r"step-00000004\.ckpt failed"):
        trainer.fit(Toy(), datamodule=ToyData())
    assert seen["step"] == 6  # the write of step 4 failed in the background; the save at 6 raised it
    assert [step for step, _ in ckpt.io.store.list_steps()] == [2]


def test_failed_final_background_write_is_raised_when_training_ends(tmp_path):
    ckpt = checkpointing(str(tmp_path / "ckpt"), every_n_steps=None, save_last=True, async_write=True)
    ckpt.io.store = FailingStore(str(tmp_path / "ckpt"), fail_from_step=0)
    with pytest.raises(CheckpointWriteError, match=r"step-00000005\.ckpt failed"):
        fit(tmp_path, ckpt, max_steps=5)


def test_step_timer_books_save_time_as_checkpoint_time_not_data_wait(tmp_path):
    timer = StepTimer("perf", warmup_steps=0)
    ckpt = checkpointing(str(tmp_path / "ckpt"), every_n_steps=2, keep_last_k=0)
    real_write = ckpt.io.store.write

    def slow_write(name: str, checkpoint: dict[str, Any], fault: Any = None) -> Any:
        time.sleep(0.3)  # slow storage
        return real_write(name, checkpoint, fault)

    ckpt.io.store.write = slow_write
    pl.seed_everything(7, verbose=False)
    trainer = trainer_for(tmp_path, ckpt, callbacks=[timer], max_steps=6)  # the runners' order
    trainer.fit(Toy(), datamodule=ToyData())
    records = timer.times.records
    assert len(records) == 6
    for index in (2, 4):  # the saves after global steps 2 and 4 fall into the next step's interval
        assert records[index].ckpt_s >= 0.3 and records[index].step_s >= 0.3
        assert records[index].data_wait_s < 0.1  # the in-memory loader is instant: no storage time here
    assert all(r.ckpt_s == 0.0 for i, r in enumerate(records) if i not in (2, 4))
    assert len(ckpt.io.saves) == 3 and all(s["blocking_s"] >= 0.3 for s in ckpt.io.saves)


def test_every_n_minutes_counts_training_time(tmp_path):
    now = [1000.0]

    class Clock(pl.Callback):  # 25 "seconds" per step
        def on_train_batch_start(self, *args: Any) -> None:
            now[0] += 25.0

    ckpt = checkpointing(str(tmp_path / "ckpt"), every_n_minutes=1, save_last=False, keep_last_k=0,
                         clock=lambda: now[0])
    now[0] += 3600  # set-up time before training does not count
    pl.seed_everything(7, verbose=False)
    trainer = trainer_for(tmp_path, ckpt, callbacks=[Clock()], max_steps=9)
    trainer.fit(Toy(), datamodule=ToyData())
    assert [s["step"] for s in ckpt.io.saves] == [3, 6, 9]  # 75 s >= 1 min after each previous save


def test_every_n_minutes_with_a_tiny_interval_saves_every_step(tmp_path):
    ckpt = checkpointing(str(tmp_path / "ckpt"), every_n_minutes=1e-6, save_last=False, keep_last_k=0)
    fit(tmp_path, ckpt, max_steps=4)
    assert [s["step"] for s in ckpt.io.saves] == [1, 2, 3, 4]


@pytest.mark.parametrize("keep", [1, 3])
def test_keep_last_k_keeps_exactly_k(tmp_path, keep):
    ckpt = checkpointing(str(tmp_path / "ckpt"), every_n_steps=1, keep_last_k=keep)
    fit(tmp_path, ckpt, max_steps=5)
    names = sorted(p.name for p in (tmp_path / "ckpt").iterdir() if p.name != LOCK_NAME)  # the run's lock stays
    assert names == [checkpoint_name(s) for s in range(6 - keep, 6)]


def test_keep_last_k_zero_keeps_all(tmp_path):
    ckpt = checkpointing(str(tmp_path / "ckpt"), every_n_steps=1, keep_last_k=0)
    fit(tmp_path, ckpt, max_steps=4)
    assert [step for step, _ in ckpt.io.store.list_steps()] == [1, 2, 3, 4]


def test_saves_wait_for_the_end_of_gradient_accumulation(tmp_path):
    ckpt = checkpointing(str(tmp_path / "ckpt"), every_n_minutes=1e-6, save_last=False, keep_last_k=0)
    fit(tmp_path, ckpt, max_steps=3, accumulate_grad_batches=2)
    positions = [loader_position(ckpt.io.store.load(p)) for _, p in ckpt.io.store.list_steps()]
    assert positions == [(0, 2), (0, 4), (1, 0)]  # after whole optimizer steps only; 6 batches per epoch


def test_unwritable_dir_fails_in_setup_before_any_step(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    ckpt = checkpointing(str(blocker / "ckpt"), every_n_steps=1)
    module = Toy()
    trainer = trainer_for(tmp_path, ckpt, max_steps=3)
    with pytest.raises(ConfigError, match=r"ckpt\.dir=.*/file/ckpt is not writable"):
        trainer.fit(module, datamodule=ToyData())
    assert module.losses == {}


@pytest.mark.parametrize("kwargs, key", [({"every_n_steps": 0}, "every_n_steps"),
                                         ({"every_n_minutes": -1}, "every_n_minutes"),
                                         ({"keep_last_k": -2}, "keep_last_k")])
def test_bad_settings_name_the_key(tmp_path, kwargs, key):
    with pytest.raises(ConfigError, match=rf"ckpt\.{key}="):
        checkpointing(str(tmp_path), **kwargs)


def test_the_trigger_needs_the_storage_io_on_the_trainer(tmp_path):
    trainer = pl.Trainer(accelerator="cpu", max_steps=1, logger=False, callbacks=[Checkpointing(every_n_steps=1)],
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    with pytest.raises(TypeError, match=r"plugins=\[StorageCheckpointIO"):
        trainer.fit(Toy(), datamodule=ToyData())
