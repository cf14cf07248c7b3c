"""Data sources: where a dataset family's files are, how the embedded set is made, which Dataset
reads them. One class per family, named by ``data.source._target_``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from torch.utils.data import Dataset

from drivebench.errors import ConfigError


class Argoverse2Source:
    """Argoverse 2 motion forecasting: the real dataset at ``root``, or the embedded synthetic set.

    Args:
        root: the dataset root holding ``train/`` and ``val/`` (None: the embedded set under
            ``cache_dir/..``, generated on first use).
        size: size of the embedded set (mini | bench); ignored for a real root.
        cache_dir: where one-time preprocessing results are cached.
        seed: seed of the embedded generator.
        splits: the split folders this run reads.
    """

    name = "argoverse2"

    def __init__(self, root: str | None, size: str, cache_dir: str, seed: int = 0,
                 splits: tuple[str, ...] = ("train", "val")) -> None:
        from drivebench.data.argoverse2.generate import SIZES

        self.embedded = root is None
        if self.embedded and size not in SIZES:
            raise ConfigError(f"data.size={size!r} is not valid; choose one of: {', '.join(SIZES)}")
        self.size = size
        self.seed = seed
        self.cache_dir = Path(cache_dir).expanduser()
        self.root = (self.cache_dir.parent / f"argoverse2-synthetic-{size}-seed{seed}" if self.embedded
                     else Path(root).expanduser())
        self.splits = tuple(splits)
        self.generate_s: float | None = None
        self.preprocess: dict[str, Any] = {}
        if not self.embedded:
            self._check_real_root()

    def _check_real_root(self) -> None:
        if not self.root.is_dir():
            raise ConfigError(f"data.root={self.root} does not exist; point it at an Argoverse 2 motion-forecasting "
                              "folder (with train/ and val/ inside) or leave it unset for the embedded set")
        for split in self.splits:
            split_dir = self.root / split
            if not split_dir.is_dir() or not any(split_dir.glob("*/scenario_*.parquet")):
                raise ConfigError(f"data.root={self.root} does not look like Argoverse 2 motion forecasting: expected "
                                  f"{split_dir}/<scenario_id>/scenario_<scenario_id>.parquet")

    def prepare(self, workers: int, progress: bool) -> None:
        if self.embedded:
            from drivebench.data.argoverse2.generate import ensure_generated

            t0 = time.perf_counter()
            ensure_generated(self.root, self.size, seed=self.seed, workers=workers, progress=progress)
            self.generate_s = time.perf_counter() - t0

    def dataset(self, split: str, transform: Callable[[Any], Any] | None, workers: int, progress: bool) -> Dataset:
        from drivebench.data.argoverse2.dataset import Argoverse2Dataset

        ds = Argoverse2Dataset(self.root, split, self.cache_dir, transform=transform, preprocess_workers=workers,
                               progress=progress)
        stats = getattr(ds, "preprocess_stats", None)
        if stats is not None:
            self.preprocess[split] = stats.__dict__ if hasattr(stats, "__dict__") else dict(stats)
        return ds

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "root": str(self.root),
            "embedded": self.embedded,
            "size": self.size if self.embedded else None,
            "generate_s": self.generate_s,
            "preprocess": self.preprocess,
        }
