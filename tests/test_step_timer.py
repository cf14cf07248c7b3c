"""The step timer splits each step into data wait / transfer / compute on a real Lightning run, with
the step clock it owns handed to what records into it (datamodule, loader-wait profiler, callbacks)."""

import time
import warnings

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from drivebench.data.device_transfer import DeviceTransferDataModule
from drivebench.lit.base import DriveModule
from drivebench.perf.callback import StepTimer
from drivebench.accel.gc_freeze import FreezeHeap
from drivebench.perf.ceiling import CeilingDataModule
from drivebench.perf.clock import StepClock
from drivebench.perf.loader_wait import LoaderWaitProfiler
from drivebench.perf.callback import ValidationRecord
from drivebench.perf.summary import loss_summary, phase_stats, render_table, validation_stats


class SlowDataset(Dataset):
    """Each sample costs ``delay`` seconds to produce."""

    def __init__(self, n: int, delay: float) -> None:
        self.n, self.delay = n, delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        time.sleep(self.delay)
        g = torch.Generator().manual_seed(i)
        x = torch.randn(8, generator=g)
        return {"x": x, "y": x.sum(0, keepdim=True)}


class SlowModel(torch.nn.Module):
    def __init__(self, delay: float) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 1)
        self.delay = delay

    def forward(self, batch: dict) -> torch.Tensor:
        time.sleep(self.delay)
        return self.lin(batch["x"])


class ToyModule(DriveModule):
    def compute_loss(self, batch, outputs):
        return {"loss": torch.nn.functional.mse_loss(outputs, batch["y"])}

    def batch_size(self, batch):
        return batch["x"].shape[0]


class SlowBookkeeping(pl.Callback):
    """Stands in for work between steps that is not loading (e.g. the host waiting for the device
    when a logged loss is read back): it runs after the step timer's batch-end hook."""

    def __init__(self, delay: float) -> None:
        self.delay = delay

    def on_train_batch_end(self, *args) -> None:
        time.sleep(self.delay)


def fit(data_delay: float, compute_delay: float, steps: int = 12, warmup: int = 2, between_steps: float = 0.0,
        loader_profiler: bool = True, extra_callbacks: tuple = ()) -> StepTimer:
    module = ToyModule(SlowModel(compute_delay), optimizer=lambda p: torch.optim.SGD(p, lr=0.1))
    loader = DataLoader(SlowDataset(64, data_delay), batch_size=4)
    timer = StepTimer("perf", warmup_steps=warmup)
    callbacks = [*extra_callbacks, timer] + ([SlowBookkeeping(between_steps)] if between_steps else [])
    trainer = pl.Trainer(accelerator="cpu", max_steps=steps, logger=False, callbacks=callbacks,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         profiler=LoaderWaitProfiler() if loader_profiler else None)
    trainer.fit(module, train_dataloaders=loader)
    return timer


def test_input_bound_run_is_attributed_to_data_wait():
    timer = fit(data_delay=0.01, compute_delay=0.0)  # 4 samples x 10 ms per batch
    stats = phase_stats(timer.times)
    assert stats["steps_measured"] == 10 and stats["warmup_steps"] == 2
    assert stats["data_wait_s"]["median"] == pytest.approx(0.04, abs=0.02)
    assert stats["data_wait_fraction"] > 0.7
    assert stats["samples_per_s"] == pytest.approx(4 / stats["step_s"]["mean"], rel=1e-6)


def test_work_between_steps_is_loop_overhead_not_data_wait():
    timer = fit(data_delay=0.0, compute_delay=0.0, between_steps=0.03)
    stats = phase_stats(timer.times)
    assert stats["loop_overhead_s"]["median"] == pytest.approx(0.03, abs=0.015)
    assert stats["data_wait_s"]["median"] < 0.01
    assert stats["loop_overhead_fraction"] > 0.6


def test_without_the_loader_profiler_the_whole_gap_counts_as_data_wait():
    timer = fit(data_delay=0.0, compute_delay=0.0, between_steps=0.03, loader_profiler=False)
    stats = phase_stats(timer.times)
    assert stats["data_wait_s"]["median"] >= 0.025
    assert stats["loop_overhead_s"]["median"] == 0.0


def test_slow_loader_and_slow_bookkeeping_are_told_apart():
    timer = fit(data_delay=0.01, compute_delay=0.0, between_steps=0.02)  # 40 ms loading, 20 ms other
    stats = phase_stats(timer.times)
    assert stats["data_wait_s"]["median"] == pytest.approx(0.04, abs=0.02)
    assert stats["loop_overhead_s"]["median"] == pytest.approx(0.02, abs=0.012)


def test_gc_freeze_holds_the_heap_frozen_during_training_only():
    import gc

    seen = []

    class Probe(pl.Callback):
        def on_train_batch_start(self, *args) -> None:
            seen.append(gc.get_freeze_count())

    freeze = FreezeHeap()
    fit(data_delay=0.0, compute_delay=0.0, steps=3, warmup=0, extra_callbacks=(freeze, Probe()))
    assert seen and min(seen) > 1000 and freeze.summary()["frozen_objects"] > 1000
    assert gc.get_freeze_count() == 0


def test_the_heap_made_in_the_warm_up_is_frozen_too_and_full_collections_are_counted():
    """What the warm-up steps leave alive (a compile's graphs and caches; here 200k linked objects made at step 0)
    is frozen at the last warm-up step, so later full collections skip it; the full collections during training
    are counted with their time. The timer's warm-up can move (accel=auto's trial resets it): the freeze
    follows the value it has when the step ends."""
    import gc

    made: list = []
    frozen_at_steps: list[int] = []

    class Compile(pl.Callback):  # stands in for a compile at the first step
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            if batch_idx == 0:
                made.extend([[i] for i in range(200_000)])
                for a, b in zip(made, made[1:]):
                    a.append(b)  # cycles: what only the cyclic collector could free

    class Collect(pl.Callback):  # a full collection in a measured step, as Python starts one on its own
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            frozen_at_steps.append(gc.get_freeze_count())
            if batch_idx == 4:
                gc.collect()

    timer = StepTimer("perf", warmup_steps=3)
    freeze = FreezeHeap(timer)
    module = ToyModule(SlowModel(0.0), optimizer=lambda p: torch.optim.SGD(p, lr=0.1))
    trainer = pl.Trainer(accelerator="cpu", max_steps=6, logger=False, callbacks=[Compile(), Collect(), freeze, timer],
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, train_dataloaders=DataLoader(SlowDataset(64, 0.0), batch_size=4))
    report = freeze.summary()
    assert [r["step"] for r in report["refrozen"]] == [2]  # the last of the 3 warm-up steps
    assert report["refrozen"][0]["objects"] >= report["frozen_objects"] + 200_000
    assert frozen_at_steps[3] >= frozen_at_steps[0] + 200_000  # the measured steps run with it frozen
    assert report["gen2_collections"] >= 1 and 0 < report["gen2_max_s"] <= report["gen2_s"]
    # step 4's collection falls after the refreeze: a measured step's; the warm-up's are in the totals only
    assert 1 <= report["gen2_measured_collections"] <= report["gen2_collections"]
    assert 0 < report["gen2_measured_s"] <= report["gen2_s"]
    assert gc.get_freeze_count() == 0 and freeze._count_full not in gc.callbacks  # undone at train end
    made.clear()


def test_compute_bound_run_is_attributed_to_compute():
    timer = fit(data_delay=0.0, compute_delay=0.03)
    stats = phase_stats(timer.times)
    assert stats["compute_s"]["median"] >= 0.03
    assert stats["data_wait_fraction"] < 0.3


def test_losses_are_recorded_per_step_without_sync_tricks_on_cpu():
    timer = fit(data_delay=0.0, compute_delay=0.0, steps=12)
    losses = [r.loss for r in timer.times.records]
    assert len(losses) == 12 and all(isinstance(v, float) for v in losses)
    summary = loss_summary(timer.times.records)
    assert summary["at_steps"]["10"] is not None and summary["final"] < summary["first"]


class SleepyTransform:
    """A device transform that costs ``delay`` seconds per batch and counts its calls."""

    def __init__(self, delay: float) -> None:
        self.delay, self.calls = delay, 0

    def __call__(self, batch: dict) -> dict:
        time.sleep(self.delay)
        self.calls += 1
        return {**batch, "x": batch["x"] * 1.0}


class SlowData(DeviceTransferDataModule):
    """Train (and optionally validation) batches of :class:`SlowDataset` through the transfer hooks."""

    def __init__(self, device_transform=None, data_delay: float = 0.0) -> None:
        super().__init__(device_transform)
        self.data_delay = data_delay

    def train_dataloader(self) -> DataLoader:
        return DataLoader(SlowDataset(64, self.data_delay), batch_size=4)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(SlowDataset(8, 0.0), batch_size=4)


def test_ceiling_reuses_one_resident_batch_transformed_once():
    module = ToyModule(SlowModel(0.0), optimizer=lambda p: torch.optim.SGD(p, lr=0.1))
    seen = []

    class Spy(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            seen.append(id(batch))

    batch = next(iter(DataLoader(SlowDataset(8, 0.0), batch_size=4)))
    transform = SleepyTransform(0.05)
    ceiling = CeilingDataModule(batch, 5, transform)
    timer = StepTimer("ceiling", warmup_steps=1)
    trainer = pl.Trainer(accelerator="cpu", max_steps=5, logger=False, callbacks=[timer, Spy()], limit_val_batches=0,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, datamodule=ceiling)  # limit_val_batches=0 as the bench's ceiling phase
    assert len(set(seen)) == 1 and len(seen) == 5
    assert transform.calls == 1 and seen[0] == id(ceiling.resident)
    assert phase_stats(timer.times)["steps_measured"] == 4
    # the one transform is timed on the first step's clock, the reused batch costs nothing after it
    assert timer.times.records[0].gpu_preprocess_s >= 0.05
    assert all(r.gpu_preprocess_s == 0.0 for r in timer.times.records[1:])


def test_the_datamodule_times_the_device_transform_on_the_timers_clock():
    module = ToyModule(SlowModel(0.0), optimizer=lambda p: torch.optim.SGD(p, lr=0.1))
    data = SlowData(SleepyTransform(0.02))
    timer = StepTimer("train", warmup_steps=0)
    profiler = LoaderWaitProfiler()
    trainer = pl.Trainer(accelerator="cpu", max_steps=4, logger=False, callbacks=[timer], profiler=profiler,
                         limit_val_batches=0, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    seen_clocks = []

    class Spy(pl.Callback):
        def on_train_batch_start(self, *args) -> None:
            seen_clocks.append((data.step_clock, profiler.step_clock))

    trainer.callbacks.append(Spy())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(module, datamodule=data)
    # the LightningModule overrides no batch-transfer hook: Lightning has nothing to warn about
    assert not [w for w in caught if "overridden" in str(w.message)]
    assert seen_clocks and all(d is timer.clock and p is timer.clock for d, p in seen_clocks)
    records = timer.times.records
    assert len(records) == 4 and all(r.gpu_preprocess_s >= 0.02 for r in records)
    assert all(r.compute_s < 0.02 for r in records)  # the transform runs before the step starts
    # taken back at teardown: the datamodule's own clock is off and records nothing
    assert data.step_clock is not timer.clock and profiler.step_clock is not timer.clock
    assert not data.step_clock.enabled


def test_validation_batches_are_not_booked_on_the_next_step():
    module = ToyModule(SlowModel(0.0), optimizer=lambda p: torch.optim.SGD(p, lr=0.1))
    transform = SleepyTransform(0.03)
    timer = StepTimer("train", warmup_steps=0)
    trainer = pl.Trainer(accelerator="cpu", max_steps=6, logger=False, callbacks=[timer], val_check_interval=3,
                         limit_val_batches=2, num_sanity_val_steps=0, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, datamodule=SlowData(transform))
    assert transform.calls == 6 + 2 * 2  # two validations of two batches each went through the transform
    # each step's preprocessing is its own batch's, never a validation batch's as well
    assert all(0.03 <= r.gpu_preprocess_s < 0.06 for r in timer.times.records)


class SlowValidation(ToyModule):
    """Each validation batch costs ``step`` seconds in ``validation_step``, each epoch end ``epoch_end``."""

    def __init__(self, step: float, epoch_end: float) -> None:
        super().__init__(SlowModel(0.0), optimizer=lambda p: torch.optim.SGD(p, lr=0.1))
        self.step_delay, self.epoch_end_delay = step, epoch_end

    def validation_step(self, batch, batch_idx):
        time.sleep(self.step_delay)
        return super().validation_step(batch, batch_idx)

    def on_validation_epoch_end(self) -> None:
        time.sleep(self.epoch_end_delay)
        super().on_validation_epoch_end()


class Logged(pl.loggers.Logger):
    """Keeps what is logged: (step, metrics)."""

    def __init__(self) -> None:
        super().__init__()
        self.logged: list[tuple[int, dict]] = []

    name, version = "logged", 0

    def log_metrics(self, metrics, step=None) -> None:
        self.logged.append((step, dict(metrics)))

    def log_hyperparams(self, *args, **kwargs) -> None:
        pass


def test_each_validation_during_fit_is_split_into_wait_forward_and_epoch_end():
    """Two epochs of 4 steps, each validated on 3 batches of 20 ms plus a 200-ms epoch end; the sanity check's
    2 batches go through the same hooks and leave no record. (Bounds leave room for a loaded machine.)"""
    module = SlowValidation(step=0.02, epoch_end=0.2)
    timer = StepTimer("train", warmup_steps=0)
    logger = Logged()
    trainer = pl.Trainer(accelerator="cpu", max_epochs=2, limit_train_batches=4, limit_val_batches=3,
                         num_sanity_val_steps=2, logger=logger, callbacks=[timer], enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    data = SlowData()
    data.val_dataloader = lambda: DataLoader(SlowDataset(12, 0.0), batch_size=4)
    trainer.fit(module, datamodule=data)
    assert len(timer.times.records) == 8 == trainer.global_step  # training's step records are untouched
    assert [(v.index, v.step, v.batches) for v in timer.validations] == [(0, 4, 3), (1, 8, 3)]
    for v in timer.validations:
        assert 3 * 0.02 <= v.forward_s < 3 * 0.02 + 0.1  # the epoch end's sleep is not a forward's
        assert v.epoch_end_s >= 0.2
        parts = v.first_wait_s + v.wait_s + v.forward_s + v.epoch_end_s
        assert parts == pytest.approx(v.wall_s, abs=1e-6) and v.wall_s >= 0.26
        assert 0 <= v.lead_in_s < 0.1 and v.first_wait_s < 0.1 and v.wait_s < 0.1
    # each validation's seconds are cut out of the step after it, not booked on it
    assert all(r.step_s < 0.2 for r in timer.times.records)
    tags = {step: m for step, m in logger.logged if "perf/val_wall_s" in m}
    assert sorted(tags) == [4, 8] and tags[8]["perf/val_forward_s"] == timer.validations[1].forward_s
    assert {"perf/val_first_wait_s", "perf/val_wait_s", "perf/val_epoch_end_s", "perf/val_lead_in_s"} <= set(tags[4])

    stats = validation_stats(timer.validations)
    assert stats["runs"] == 2 and stats["batches"] == 3 and stats["steps"] == [4, 8]
    assert stats["first_s"] == timer.validations[0].wall_s
    assert stats["wall_s"]["n"] == 1 and stats["wall_s"]["median"] == timer.validations[1].wall_s  # after the first
    assert stats["total_s"] == pytest.approx(sum(v.wall_s for v in timer.validations))


def test_validation_stats_leave_the_first_run_out_of_the_spread_unless_it_is_the_only_one():
    def record(i: int, wall: float) -> ValidationRecord:
        return ValidationRecord(index=i, step=10 * (i + 1), wall_s=wall, batches=6, first_wait_s=wall / 2,
                                wait_s=wall / 4, forward_s=wall / 8, epoch_end_s=wall / 8)

    assert validation_stats([]) == {"runs": 0}
    one = validation_stats([record(0, 8.0)])
    assert one["first_s"] == 8.0 and one["wall_s"]["n"] == 1 and one["wall_s"]["median"] == 8.0
    three = validation_stats([record(0, 8.0), record(1, 2.0), record(2, 4.0)])
    assert three["runs"] == 3 and three["total_s"] == 14.0 and three["first_s"] == 8.0 and three["batches"] == 6
    assert three["wall_s"]["median"] == 3.0 and three["first_wait_s"]["median"] == 1.5
    assert three["forward_s"]["max"] == 0.5 and three["epoch_end_s"]["n"] == 2
    table = render_table({"train": {"validation": three}})
    assert "3 runs of 6 batches, 14 s in all; first 8 s, then median 3 s\n" in table
    assert "forward 0.375 s, first batch 1.5 s, later waits 0.75 s, epoch end 0.375 s" in table
    assert "1 run of 6 batches, 8 s\n" in render_table({"train": {"validation": one}})
    assert "validation" not in render_table({"train": {}})


def test_each_trainer_records_into_its_own_timers_clock():
    """Two phases one after the other (fit, then the ceiling) with the same datamodule class: no
    shared recorder, and the first timer's records stay as they were."""
    timers = []
    for delay in (0.0, 0.03):
        module = ToyModule(SlowModel(0.0), optimizer=lambda p: torch.optim.SGD(p, lr=0.1))
        timer = StepTimer("train", warmup_steps=0)
        trainer = pl.Trainer(accelerator="cpu", max_steps=3, logger=False, callbacks=[timer], limit_val_batches=0,
                             enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
        trainer.fit(module, datamodule=SlowData(SleepyTransform(delay)))
        timers.append(timer)
    first, second = timers
    assert first.clock is not second.clock
    assert all(r.gpu_preprocess_s < 0.03 for r in first.times.records)
    assert all(r.gpu_preprocess_s >= 0.03 for r in second.times.records)


def test_a_clock_nobody_started_records_nothing():
    clock = StepClock()
    clock.mark("fetched")
    clock.add("loader_next", 1.0)
    with clock.span("h2d"):
        pass
    assert clock.pop() == ({}, {}, {})


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="warmup_steps"):
        StepTimer(warmup_steps=-1)
    with pytest.raises(ValueError, match="log_every_n_steps"):
        StepTimer(log_every_n_steps=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_the_datamodule_times_the_copy_and_the_step_with_events():
    module = ToyModule(SlowModel(0.0), optimizer=lambda p: torch.optim.SGD(p, lr=0.1))
    transform = SleepyTransform(0.0)
    timer = StepTimer("train", warmup_steps=0)
    trainer = pl.Trainer(accelerator="gpu", devices=1, max_steps=4, logger=False, callbacks=[timer],
                         limit_val_batches=0, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    data = SlowData(transform)
    trainer.fit(module, datamodule=data)
    records = timer.times.records
    assert len(records) == 4 and transform.calls == 4
    assert all(r.device_h2d_s is not None and r.device_h2d_s >= 0 for r in records)  # the datamodule's h2d span
    assert all(r.device_compute_s is not None and r.device_compute_s > 0 for r in records)
    assert all(r.loss is not None for r in records)
