"""A data source (what ``DriveDataModule`` takes) whose every split is one in-memory dataset, for tests that
need real loader workers and a real Trainer around a dataset of their own."""

from __future__ import annotations

from typing import Any

from torch.utils.data import Dataset


class DatasetSource:
    """``DriveDataModule``'s source protocol over ``dataset``: nothing to prepare, the same dataset for each split."""

    def __init__(self, dataset: Dataset, name: str = "in-memory") -> None:
        self.dataset_ = dataset
        self.name = name

    def prepare(self, workers: int, progress: bool) -> None:
        pass

    def dataset(self, split: str, transform: Any, accel: Any, train: bool, progress: bool) -> Dataset:
        return self.dataset_

    def describe(self) -> dict:
        return {}
