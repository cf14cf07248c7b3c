"""Data sources: where a dataset family's files are, how the embedded set is made, which Dataset
reads them. One class per family, named by ``data.source._target_``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from torch.utils.data import Dataset

from drivebench.accel.settings import AccelSettings
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

    def dataset(self, split: str, transform: Callable[[Any], Any] | None, accel: AccelSettings, train: bool,
                progress: bool) -> Dataset:
        from drivebench.data.argoverse2.dataset import Argoverse2Dataset

        ds = Argoverse2Dataset(self.root, split, self.cache_dir, transform=transform,
                               preprocess_workers=accel.preprocess_workers, progress=progress)
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


class NuScenesSource:
    """nuScenes camera data: the real dataset at ``root`` (``version`` v1.0-mini / v1.0-trainval), or
    the embedded synthetic set (real on-disk format, read by the official devkit) made on first use.

    Args:
        root: the nuScenes dataroot (None: the embedded set under ``cache_dir/..``).
        size: embedded set size (mini | bench).
        version: table version; None = the embedded set's, or detected from ``root``.
        cache_dir: where the sample index and precomputed targets are cached.
        seed: seed of the embedded generator (augmentation is seeded by the run's ``seed``).
        image_size: embedded JPEG size [w, h] (None: the size's default, 1600x900 for bench).
        on_corrupt: fail | skip (skipped samples are counted in the summary).
    """

    name = "nuscenes"

    def __init__(self, root: str | None, size: str, cache_dir: str, version: str | None = None, seed: int = 0,
                 image_size: list[int] | None = None, on_corrupt: str = "fail", run_seed: int = 0) -> None:
        from drivebench.data.nuscenes.generate import PRESETS

        self.embedded = root is None
        if self.embedded and size not in PRESETS:
            raise ConfigError(f"data.size={size!r} is not valid; choose one of: {', '.join(PRESETS)}")
        if on_corrupt not in ("fail", "skip"):
            raise ConfigError(f"data.on_corrupt={on_corrupt!r} is not valid; choose fail or skip")
        self.size = size
        self.seed = seed
        self.run_seed = run_seed
        self.image_size = tuple(image_size) if image_size else None
        self.on_corrupt = on_corrupt
        self.cache_dir = Path(cache_dir).expanduser()
        suffix = f"-{self.image_size[0]}x{self.image_size[1]}" if self.image_size else ""
        self.root = (self.cache_dir.parent / f"nuscenes-synthetic-{size}{suffix}-seed{seed}" if self.embedded
                     else Path(root).expanduser())
        self.version = version or (PRESETS[size].version if self.embedded else None)
        self.infos: Any = None
        self.generate_s: float | None = None
        self.index_s: float | None = None
        self.pipelines: dict[str, Any] = {}
        if not self.embedded and not self.root.is_dir():
            raise ConfigError(f"data.root={self.root} does not exist; point it at a nuScenes dataroot (with "
                              "v1.0-*/, samples/, maps/) or leave it unset for the embedded set")

    def known_sequences(self, split: str) -> int | None:
        """Driving sequences (scenes) of ``split`` known before any work: the embedded set's size
        preset; ``None`` for a real root (counted once its infos are loaded)."""
        if not self.embedded:
            return None
        from drivebench.data.nuscenes.generate import PRESETS

        preset = PRESETS[self.size]
        return preset.train_scenes if split == "train" else preset.val_scenes

    def prepare(self, workers: int, progress: bool) -> None:
        if self.embedded:
            from drivebench.data.nuscenes.generate import ensure_generated

            t0 = time.perf_counter()
            ensure_generated(self.root, self.size, seed=self.seed, workers=workers, image_size=self.image_size,
                             progress=progress)
            self.generate_s = time.perf_counter() - t0
        from drivebench.data.nuscenes.infos import build_infos

        t0 = time.perf_counter()
        try:
            self.infos = build_infos(self.root, self.version, workers=workers, on_corrupt=self.on_corrupt,
                                     cache_dir=self.cache_dir)
        except FileNotFoundError as err:
            raise ConfigError(f"data.root={self.root} is not a usable nuScenes dataroot: {err}") from err
        self.index_s = time.perf_counter() - t0

    def dataset(self, split: str, transform: Any, accel: AccelSettings, train: bool, progress: bool) -> Dataset:
        from drivebench.data.transforms.dataset import NuScenesDataset

        if self.infos is None:
            self.prepare(accel.preprocess_workers, progress)
        records = self.infos.split(split)
        if not records:
            raise ConfigError(f"data.root={self.root} ({self.version}) has no samples in split {split!r}")
        pipeline = transform.build(records, self.root, accel, self.cache_dir, train=train, progress=progress)
        self.pipelines[split] = transform
        return NuScenesDataset(records, pipeline, seed=self.run_seed, root=self.root, on_corrupt=self.on_corrupt)

    def describe(self) -> dict[str, Any]:
        info: dict[str, Any] = {
            "name": self.name, "root": str(self.root), "embedded": self.embedded,
            "size": self.size if self.embedded else None, "version": self.version,
            "image_size": list(self.image_size) if self.image_size else None,
            "generate_s": self.generate_s, "index_s": self.index_s,
        }
        if self.infos is not None:
            info["samples"] = len(self.infos)
            info["skipped_at_index"] = dict(self.infos.skipped)
        for split, pipe in self.pipelines.items():
            info[f"pipeline_{split}"] = {k: v for k, v in pipe.stats.items() if k != "image_cache"}
        return info
