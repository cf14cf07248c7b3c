"""drivebench.ckpt.write_probe: the one timed checkpoint-sized write (doctor and bench=storage)."""

from __future__ import annotations

import fsspec

from drivebench.ckpt.store import CheckpointStore
from drivebench.ckpt.write_probe import CHUNK, probe_name, remove, timed_read, timed_write, write_probe


def test_local_probe_writes_the_bytes_with_fsync_and_leaves_nothing(tmp_path):
    store = CheckpointStore(str(tmp_path))
    name = probe_name("test")
    stats = timed_write(store, name, CHUNK + 123)  # more than one chunk, and a partial one
    assert (tmp_path / name).stat().st_size == CHUNK + 123
    assert stats.nbytes == CHUNK + 123 and 0 <= stats.fsync_s <= stats.seconds and stats.mb_per_s > 0
    assert timed_read(store, name) > 0
    remove(store, name)
    assert write_probe(store, 4096).nbytes == 4096
    assert list(tmp_path.iterdir()) == []


def test_remote_probe_is_one_object_and_is_removed():
    store = CheckpointStore("memory://write-probe/x")
    store.prepare()
    name = probe_name("test")
    stats = timed_write(store, name, 5000)
    fs = fsspec.filesystem("memory")
    assert len(fs.cat_file(f"/write-probe/x/{name}")) == 5000 and stats.fsync_s == 0.0
    remove(store, name)
    write_probe(store, 10)
    assert fs.ls("/write-probe/x") == []
