"""The training loader (``EpochStream``): with ``accel.prefetch_across_epochs`` one loader iterator
over all epochs gives exactly the batches of the epoch-by-epoch loader; either way it follows
Lightning's epochs and is a stateful loader Lightning saves in checkpoints and resumes mid-epoch."""

from __future__ import annotations

import warnings

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from drivebench.data.epoch_stream import EpochStream
from drivebench.data.sampling import RandomBatchSampler, SampleKey, keyed_batch, sample_key, unpack_key


class KeyEcho(Dataset):
    """Returns what it was asked for, and from which process (so prefetching is visible)."""

    accepts_sample_keys = True

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, item):
        index, epoch, _ = unpack_key(item)
        return torch.tensor([index, -1 if epoch is None else epoch])


def _loader_factory(dataset: Dataset, workers: int):
    def make(batch_sampler):
        kwargs = {"num_workers": workers, "persistent_workers": workers > 0}
        return DataLoader(dataset, batch_sampler=batch_sampler, **kwargs)
    return make


def _epoch_by_epoch(n: int, batch: int, epochs: int, replicas: int = 1, rank: int = 0) -> list[list[list[int]]]:
    """A plain DataLoader per epoch over the sampler's plan of that epoch: the reference."""
    sampler = RandomBatchSampler(n, batch, num_replicas=replicas, rank=rank, seed=7)
    out = []
    for e in range(epochs):
        keyed = [keyed_batch(b, e) for b in sampler.plan(e)]
        out.append([b.tolist() for b in DataLoader(KeyEcho(n), batch_sampler=keyed)])
    return out


def test_sample_keys_carry_the_epoch_and_plain_items_still_unpack():
    assert sample_key(5, 3) == SampleKey(5, 3, False)
    assert sample_key((5, True), 3) == SampleKey(5, 3, True)
    assert unpack_key(SampleKey(5, 3, True)) == (5, 3, True)
    assert unpack_key((5, True)) == (5, None, True)
    assert unpack_key(5) == (5, None, False)


@pytest.mark.parametrize("workers", [0, 2])
def test_stream_gives_the_epoch_by_epoch_batches(workers):
    expected = _epoch_by_epoch(22, 4, 3)
    stream = EpochStream(RandomBatchSampler(22, 4, seed=7), _loader_factory(KeyEcho(22), workers))
    got = []
    for e in range(3):
        stream.sampler.set_epoch(e)  # as Lightning does
        assert len(stream) == 5
        got.append([b.tolist() for b in stream])
    assert got == expected
    assert all(row[1] == e for e, epoch in enumerate(got) for batch in epoch for row in batch)
    assert stream.iterator_starts == 1, "one iterator for all epochs"
    stream.close()


def test_stream_without_set_epoch_moves_on_to_the_next_epoch():
    expected = _epoch_by_epoch(10, 2, 2)
    stream = EpochStream(RandomBatchSampler(10, 2, seed=7), _loader_factory(KeyEcho(10), 0))
    assert [[b.tolist() for b in stream] for _ in range(2)] == expected


def test_stream_resumes_mid_epoch_and_restarts_when_told_another_epoch():
    expected = _epoch_by_epoch(22, 4, 4)
    stream = EpochStream(RandomBatchSampler(22, 4, seed=7), _loader_factory(KeyEcho(22), 2), start=(1, 2))
    stream.sampler.set_epoch(1)
    assert [b.tolist() for b in stream] == expected[1][2:]
    it = iter(stream)
    next(it)  # epoch 2 abandoned after one batch ...
    stream.sampler.set_epoch(3)  # ... and epoch 3 asked for: the stream restarts there
    assert [b.tolist() for b in stream] == expected[3]
    assert stream.iterator_starts == 2


def test_stream_splits_ranks_like_the_epoch_loader():
    for rank in range(2):
        expected = _epoch_by_epoch(20, 3, 2, replicas=2, rank=rank)
        stream = EpochStream(RandomBatchSampler(20, 3, num_replicas=2, rank=rank, seed=7),
                             _loader_factory(KeyEcho(20), 0))
        assert [[b.tolist() for b in stream] for _ in range(2)] == expected


def test_unkeyed_datasets_get_plain_indices():
    class Plain(Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, i):
            assert isinstance(i, int)
            return i

    stream = EpochStream(RandomBatchSampler(8, 4, seed=1), _loader_factory(Plain(), 0), keyed=False)
    assert sorted(i for b in stream for i in b.tolist()) == list(range(8))


class _Record(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.seen: list[tuple[int, list[list[int]]]] = []

    def training_step(self, batch, batch_idx):
        self.seen.append((self.current_epoch, batch.tolist()))
        return (self.w * 0).sum() + self.w.sum() ** 2

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_lightning_sees_epochs_and_every_batch_once_per_epoch():
    expected = _epoch_by_epoch(18, 4, 3)
    stream = EpochStream(RandomBatchSampler(18, 4, seed=7), _loader_factory(KeyEcho(18), 2))
    module = _Record()
    trainer = pl.Trainer(max_epochs=3, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, train_dataloaders=stream)
    got = [[b for e, b in module.seen if e == epoch] for epoch in range(3)]
    assert got == expected
    assert all(row[1] == e for e, b in module.seen for row in b), "each sample is drawn for its own epoch"
    assert stream.iterator_starts == 1


def test_close_stops_persistent_workers():
    import multiprocessing

    before = len(multiprocessing.active_children())
    stream = EpochStream(RandomBatchSampler(12, 4, seed=1), _loader_factory(KeyEcho(12), 2))
    list(stream)
    assert len(multiprocessing.active_children()) == before + 2
    stream.close()
    assert len(multiprocessing.active_children()) == before


def test_iterating_an_epoch_again_starts_it_over_like_a_dataloader():
    expected = _epoch_by_epoch(22, 4, 1)
    stream = EpochStream(RandomBatchSampler(22, 4, seed=7), _loader_factory(KeyEcho(22), 0))
    stale = iter(stream)
    next(stale), next(stale)  # two batches drawn, then the epoch is iterated again
    assert [b.tolist() for b in stream] == expected[0]
    assert list(stale) == [], "an older iterator of the stream stops instead of stealing batches"


def test_stop_workers_ends_the_workers_a_persistent_loader_keeps():
    """mmengine's runner leaves its persistent workers to interpreter exit, where their join hung on
    the H200; stop_workers ends them while the process is whole."""
    from drivebench.data.epoch_stream import stop_workers

    loader = DataLoader(list(range(8)), batch_size=2, num_workers=2, persistent_workers=True)
    iterator = iter(loader)
    assert next(iterator).tolist() == [0, 1]
    workers = list(iterator._workers)
    assert loader._iterator is iterator and all(w.is_alive() for w in workers)
    stop_workers(loader, iterator)
    assert loader._iterator is None
    assert not any(w.is_alive() for w in workers)
    assert torch.cat(list(loader)).tolist() == list(range(8))  # the loader still works afterwards


@pytest.mark.parametrize("across_epochs", [True, False])
def test_state_is_the_next_batch_the_training_loop_gets(across_epochs):
    stream = EpochStream(RandomBatchSampler(22, 4, seed=7), _loader_factory(KeyEcho(22), 2),
                         across_epochs=across_epochs)
    assert stream.state_dict() == {"epoch": 0, "batches_done": 0}
    it = iter(stream)
    next(it), next(it)
    assert stream.state_dict() == {"epoch": 0, "batches_done": 2}  # what was handed out, not what workers drew
    list(it)
    assert stream.state_dict() == {"epoch": 1, "batches_done": 0}  # after the last batch: the next epoch's start
    stream.close()


@pytest.mark.parametrize("across_epochs", [True, False])
def test_load_state_dict_resumes_there_unless_another_epoch_is_asked_for(across_epochs):
    expected = _epoch_by_epoch(22, 4, 3)
    stream = EpochStream(RandomBatchSampler(22, 4, seed=7), _loader_factory(KeyEcho(22), 2),
                         across_epochs=across_epochs)
    list(stream)  # an iterator exists already: loading a state drops it
    stream.load_state_dict({"epoch": 1, "batches_done": 3})
    it = iter(stream)
    stream.sampler.set_epoch(1)  # Lightning sets the epoch after creating the iterator: iterating is lazy
    assert [b.tolist() for b in it] == expected[1][3:]
    assert [b.tolist() for b in stream] == expected[2]
    # Lightning ended epoch 1 early (a limit below the plan) and goes on with epoch 2: from its start
    stream.load_state_dict({"epoch": 1, "batches_done": 3})
    stream.sampler.set_epoch(2)
    assert [b.tolist() for b in stream] == expected[2]
    stream.close()


class _SaveAt(pl.Callback):
    def __init__(self, step: int, path) -> None:
        self.step, self.path = step, path

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            trainer.save_checkpoint(self.path)


@pytest.mark.parametrize("across_epochs", [True, False])
def test_lightning_saves_and_restores_the_position_mid_epoch(tmp_path, across_epochs):
    """Lightning's own checkpoint (no drivebench callback): the stream's state is in the fit loop's
    state and a resumed fit draws exactly the batches the uninterrupted one drew next."""
    def fit(max_steps, callbacks=(), ckpt_path=None):
        stream = EpochStream(RandomBatchSampler(18, 4, seed=7), _loader_factory(KeyEcho(18), 1),
                             across_epochs=across_epochs)
        module = _Record()
        trainer = pl.Trainer(max_steps=max_steps, accelerator="cpu", logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False, callbacks=list(callbacks))
        trainer.fit(module, train_dataloaders=stream, ckpt_path=ckpt_path)
        return module.seen

    path = tmp_path / "mid.ckpt"
    straight = fit(11, [_SaveAt(6, path)])  # 4 batches per epoch: step 6 is batch 2 of epoch 1
    state = torch.load(path, weights_only=True)["loops"]["fit_loop"]["state_dict"]["combined_loader"]
    assert state == [{"epoch": 1, "batches_done": 2}]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed = fit(11, ckpt_path=str(path))
    assert resumed == straight[6:]
    assert not [w for w in caught if "not resumable" in str(w.message)]  # Lightning sees a stateful loader


def test_a_stream_survives_lightnings_fit_end_and_rewinds_on_its_live_workers():
    """accel=auto's candidates share one training stream: held, it outlives Lightning's loader reset at fit
    end, and rewound it gives the first batches again from the same worker processes."""
    from lightning.pytorch.utilities.combined_loader import _shutdown_workers_and_reset_iterator

    expected = _epoch_by_epoch(22, 4, 1)[0]
    stream = EpochStream(RandomBatchSampler(22, 4, seed=7), _loader_factory(KeyEcho(22), 1))
    first = iter(stream)
    assert [next(first).tolist() for _ in range(3)] == expected[:3]
    workers = list(stream.loader._iterator._workers)
    stream.hold_workers = True  # what DriveDataModule.hand_over_streams sets
    _shutdown_workers_and_reset_iterator(stream)  # what Lightning's fit loop does to its loaders at the end
    assert all(w.is_alive() for w in workers)
    stream.load_state_dict({"epoch": 0, "batches_done": 0})
    assert [b.tolist() for b in stream] == expected
    assert list(stream.loader._iterator._workers) == workers and all(w.is_alive() for w in workers)
    stream.close()
    assert not any(w.is_alive() for w in workers)
    # not held (every run but the trial's candidates): Lightning's reset stops the workers, as for a DataLoader
    stream.hold_workers = False
    stream.load_state_dict({"epoch": 0, "batches_done": 0})
    assert next(iter(stream)).tolist() == expected[0]
    workers = list(stream.loader._iterator._workers)
    _shutdown_workers_and_reset_iterator(stream)
    assert not any(w.is_alive() for w in workers)
