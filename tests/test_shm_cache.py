"""The shared-memory caches return exactly what they were built from, in workers too."""

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from drivebench.accel.shm_cache import CacheDoesNotFit, SharedArrayCache, SharedSampleCache


class RawDataset(Dataset):
    def __init__(self, n: int = 10) -> None:
        self.n = n
        self.transform = lambda raw: {"value": torch.as_tensor(raw["a"]).sum(), "id": raw["id"]}

    def __len__(self):
        return self.n

    def load_raw(self, i):
        return {"id": i, "a": np.arange(i * 10, i * 10 + 5, dtype=np.float32)}

    def __getitem__(self, i):
        return self.transform(self.load_raw(i))


def test_sample_cache_matches_dataset_and_counts_hits():
    ds = RawDataset()
    cache = SharedSampleCache(ds, max_bytes=1e9, progress=False)
    for i in range(len(ds)):
        got = cache[i]
        assert got["value"] == ds[i]["value"] and got["id"] == i
    stats = cache.stats()
    assert stats.entries == 10 and stats.bytes > 0 and stats.hits == 10 and stats.misses == 0


def test_sample_cache_in_loader_workers():
    ds = RawDataset(16)
    cache = SharedSampleCache(ds, max_bytes=1e9, progress=False)
    loader = DataLoader(cache, batch_size=4, num_workers=2)
    ids = torch.cat([b["id"] for b in loader]).tolist()
    assert ids == list(range(16))
    assert cache.stats().hits == 16  # counted by the workers in shared memory


def test_sample_cache_refuses_to_exceed_budget():
    with pytest.raises(CacheDoesNotFit, match="shm_cache_max_gb"):
        SharedSampleCache(RawDataset(), max_bytes=100, progress=False)


def test_array_cache_zero_copy_readonly_and_misses():
    images = {f"img{i}.jpg": np.full((4, 6, 3), i, dtype=np.uint8) for i in range(5)}
    cache = SharedArrayCache(list(images), images.__getitem__, max_bytes=1e9, progress=False)
    got = cache.get("img3.jpg")
    assert got.shape == (4, 6, 3) and (got == 3).all() and not got.flags.writeable
    assert cache.get("other.jpg") is None
    stats = cache.stats().to_dict()
    assert stats["hits"] == 1 and stats["misses"] == 1 and stats["hit_rate"] == 0.5
