"""The device prefetch wrapper: order, errors, shutdown and epochs under a real Lightning fit.
Its CUDA side (side stream, event wait, record_stream) is checked by the GPU test at the end."""

import threading

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from drivebench.data.device_prefetch import READY_KEY, DevicePrefetchLoader
from drivebench.data.device_transfer import DeviceTransferDataModule
from drivebench.data.sampling import RandomBatchSampler
from drivebench.lit.base import DriveModule


class Indexed(Dataset):
    def __len__(self) -> int:
        return 24

    def __getitem__(self, i: int) -> dict:
        return {"idx": torch.tensor(i), "x": torch.full((3,), float(i))}


def collate(samples: list[dict]) -> dict:
    return {k: torch.stack([s[k] for s in samples]) for k in samples[0]}


def loader(seed: int = 0) -> DataLoader:
    return DataLoader(Indexed(), batch_sampler=RandomBatchSampler(24, 4, seed=seed), collate_fn=collate)


def move(batch: dict, device: torch.device) -> dict:
    return {k: v.to(device) for k, v in batch.items()}


def double(batch: dict) -> dict:
    batch["x"] = batch["x"] * 2
    return batch


def test_batches_come_in_loader_order_transformed_and_marked():
    wrapped = DevicePrefetchLoader(loader(), torch.device("cpu"), move, double, depth=2)
    got = list(wrapped)
    plain = list(loader())
    assert [b["idx"].tolist() for b in got] == [b["idx"].tolist() for b in plain]
    assert all(torch.equal(g["x"], 2 * p["x"]) for g, p in zip(got, plain))
    assert all(b[READY_KEY] for b in got)
    assert len(wrapped) == 6 and wrapped.stats()["batches"] == 6
    assert wrapped.batch_sampler is wrapped.loader.batch_sampler


def test_an_error_in_the_thread_is_raised_in_the_training_thread():
    def broken(batch: dict) -> dict:
        raise KeyError("photometric_params missing")

    wrapped = DevicePrefetchLoader(loader(), torch.device("cpu"), move, broken)
    with pytest.raises(KeyError, match="photometric_params"):
        next(iter(wrapped))


def test_close_mid_epoch_stops_the_thread():
    wrapped = DevicePrefetchLoader(loader(), torch.device("cpu"), move, None, depth=1)
    it = iter(wrapped)
    next(it)
    wrapped.close()
    assert not it.thread.is_alive()
    assert not any(t.name == "drivebench-device-prefetch" and t.is_alive() for t in threading.enumerate())


class Recorder(DriveModule):
    def __init__(self) -> None:
        super().__init__(torch.nn.Linear(3, 1), optimizer=lambda p: torch.optim.SGD(p, lr=0.01))
        self.seen: list[list[int]] = []

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        self.seen.append(batch["idx"].tolist())
        return self.net(batch["x"]).mean()


class Prefetched(DeviceTransferDataModule):
    """The datamodule's transfer hooks over a prefetch wrapper; its own device transform counts calls."""

    def __init__(self, make_loader) -> None:
        super().__init__(device_transform=self._count)
        self.make_loader = make_loader
        self.transformed_again = 0

    def _count(self, batch: dict) -> dict:
        self.transformed_again += 1
        return batch

    def train_dataloader(self) -> DevicePrefetchLoader:
        return DevicePrefetchLoader(self.make_loader(), torch.device("cpu"), self.move_batch, double)


def test_lightning_sets_the_epoch_through_the_wrapper_and_skips_the_second_transform():
    module = Recorder()
    data = Prefetched(lambda: loader(seed=3))
    trainer = pl.Trainer(accelerator="cpu", max_epochs=2, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, datamodule=data)
    sampler = RandomBatchSampler(24, 4, seed=3)
    expected = []
    for epoch in (0, 1):
        sampler.set_epoch(epoch)
        expected += [list(b) for b in sampler]
    assert module.seen == expected  # epoch 1 reshuffled: Lightning reached set_epoch through the wrapper
    assert data.transformed_again == 0  # prefetched batches are not transformed a second time


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_side_stream_batches_match_the_inline_path_on_cuda():
    device = torch.device("cuda", torch.cuda.current_device())

    def heavy(batch: dict) -> dict:  # enough queued work that a missing stream wait would show
        x = batch["x"]
        for _ in range(50):
            x = torch.sin(x) + x
        batch["x"] = x
        return batch

    wrapped = DevicePrefetchLoader(loader(), device, move, heavy, depth=2)
    got = [b["x"].cpu() for b in wrapped]
    expected = [heavy(move(b, device))["x"].cpu() for b in loader()]
    assert all(torch.equal(g, e) for g, e in zip(got, expected))


def test_the_wrapper_over_an_epoch_stream_keeps_epochs_and_one_iterator():
    """device_prefetch over prefetch_across_epochs: the stream still follows Lightning's epochs."""
    from drivebench.data.epoch_stream import EpochStream

    module = Recorder()
    stream = EpochStream(RandomBatchSampler(24, 4, seed=3),
                         lambda bs: DataLoader(Indexed(), batch_sampler=bs, collate_fn=collate), keyed=False)
    data = Prefetched(lambda: stream)
    trainer = pl.Trainer(accelerator="cpu", max_epochs=3, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, datamodule=data)
    sampler = RandomBatchSampler(24, 4, seed=3)
    expected = []
    for epoch in (0, 1, 2):
        sampler.set_epoch(epoch)
        expected += [list(b) for b in sampler]
    assert module.seen == expected
    # Lightning iterates its loader once before training starts; the prefetch thread may already have
    # drawn a batch from that iterator, and then epoch 0 starts over once. No restarts after that.
    assert stream.iterator_starts <= 2


def test_the_wrapper_reports_the_position_of_what_it_handed_out_not_of_what_it_drew():
    """The thread draws ``depth`` batches ahead of the training loop: a checkpoint must resume after
    the batches the loop got, so the wrapper's state is the stream's as of the last batch handed out."""
    import time

    from drivebench.data.epoch_stream import EpochStream

    def stream():
        return EpochStream(RandomBatchSampler(24, 4, seed=3),
                           lambda bs: DataLoader(Indexed(), batch_sampler=bs, collate_fn=collate), keyed=False)

    wrapped = DevicePrefetchLoader(stream(), torch.device("cpu"), move, None, depth=3)
    assert wrapped.state_dict() == {"epoch": 0, "batches_done": 0}
    it = iter(wrapped)
    first = [next(it)["idx"].tolist() for _ in range(2)]
    deadline = time.monotonic() + 20
    # the thread fills its queue (3) and holds one more: the whole 6-batch epoch gets drawn
    while wrapped.loader.state_dict() != {"epoch": 1, "batches_done": 0} and time.monotonic() < deadline:
        time.sleep(0.01)
    assert wrapped.loader.state_dict() == {"epoch": 1, "batches_done": 0}
    assert wrapped.state_dict() == {"epoch": 0, "batches_done": 2}
    rest = [b["idx"].tolist() for b in it]
    wrapped.close()

    resumed = DevicePrefetchLoader(stream(), torch.device("cpu"), move, None, depth=3)
    resumed.load_state_dict({"epoch": 0, "batches_done": 2})
    assert [b["idx"].tolist() for b in resumed] == rest
    assert resumed.state_dict() == {"epoch": 1, "batches_done": 0}
    assert first + rest == [b for b in RandomBatchSampler(24, 4, seed=3)]
    resumed.close()
