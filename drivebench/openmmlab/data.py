"""mmdet3d's own dataset and transforms, as a drivebench data source (``data=mmdet3d``).

Two modes (``data.dataset``):

* ``embedded``: drivebench's nuScenes set (the embedded synthetic one, or a real root at
  ``data.root``) is indexed by drivebench's devkit-based indexer, written as mmdet3d v1.x info
  files (``to_mmdet3d_v1``) into the cache, and the config's dataset is pointed at it
  (``data_root``, ``ann_file``, ``data_prefix``). Needs a nuScenes config (NuScenesDataset).
* ``config``: the dataset exactly as the config names it (paths from the config or
  ``model.cfg_options``), for any dataset mmdet3d knows.

Validation reports the loss on the validation split: the train pipeline without its random
augmentations, on the config's validation annotations (mmdet3d's detection metrics need its
evaluators; run them with mmdet3d's tools).
"""

from __future__ import annotations

import hashlib
import os
import pickle
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping

from drivebench.errors import ConfigError, bad_choice
from drivebench.openmmlab import register_mmdet3d, require
from drivebench.openmmlab.configs import load_config

DATASET_MODES = ("embedded", "config")
# transforms that draw random numbers: left out of the validation-loss pipeline
RANDOM_TRANSFORMS = frozenset({
    "GlobalRotScaleTrans", "RandomFlip3D", "PointShuffle", "ObjectSample", "ObjectNoise", "RandomJitterPoints",
    "PhotoMetricDistortion3D", "PhotoMetricDistortion", "RandomDropPointsColor", "RandomResize", "RandomFlip",
})
WRAPPERS = frozenset({"CBGSDataset", "RepeatDataset", "ClassBalancedDataset", "ConcatDataset"})


def innermost(dataset_cfg: dict) -> dict:
    """The real dataset inside wrappers such as CBGSDataset(dataset=...)."""
    node = dataset_cfg
    while node.get("type") in WRAPPERS and isinstance(node.get("dataset"), Mapping):
        node = node["dataset"]
    return node


def loss_pipeline(pipeline: list[dict]) -> list[dict]:
    """The train pipeline without random augmentation: annotations loaded, deterministic."""
    return [dict(t) for t in pipeline if t.get("type") not in RANDOM_TRANSFORMS]


def embedded_prefix() -> dict[str, str]:
    """``data_prefix`` matching ``to_mmdet3d_v1`` (bare file names under nuScenes' folders)."""
    from drivebench.data.nuscenes.infos import DEFAULT_PREFIX

    return {**DEFAULT_PREFIX, "img": ""}


def write_infos(index: Any, splits: tuple[str, ...], out_root: Path) -> dict[str, Path]:
    """mmdet3d v1.x info files of ``splits``, one pickle each, in a folder keyed by their content."""
    from drivebench.data.nuscenes.infos import to_mmdet3d_v1

    version = index.metainfo["version"]
    payloads = {s: pickle.dumps(to_mmdet3d_v1(index.split(s), version=version), protocol=4) for s in splits}
    digest = hashlib.sha1(b"".join(payloads[s] for s in splits)).hexdigest()[:16]
    folder = out_root / f"mmdet3d-infos-{digest}"
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, blob in payloads.items():
        path = folder / f"nuscenes_infos_{split}.pkl"
        if not path.exists():
            fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
            with os.fdopen(fd, "wb") as fh:
                fh.write(blob)
            os.replace(tmp, path)  # atomic: ranks started together never read half a file
        paths[split] = path
    return paths


class MMDet3DSource:
    """A :class:`~drivebench.data.datamodule.DataSource` whose datasets are mmdet3d's.

    Args:
        config / preset / cfg_options: the model's config (``model.config``, ``model.size``,
            ``model.cfg_options``); the dataset and pipelines are read from it.
        dataset: ``embedded`` (drivebench's nuScenes set) or ``config`` (the config's own paths).
        root, size, version, image_size, on_corrupt, seed, run_seed: the nuScenes set, as in
            ``data=nuscenes`` (used in ``embedded`` mode).
        cache_dir: where the sample index and the mmdet3d info files are cached.
        train_split / val_split: record splits written as the train / val info files.
    """

    name = "mmdet3d"

    def __init__(self, config: str, preset: str, cfg_options: Mapping[str, Any] | None, cache_dir: str,
                 dataset: str = "embedded", root: str | None = None, size: str = "mini", version: str | None = None,
                 image_size: list[int] | None = None, on_corrupt: str = "fail", seed: int = 0, run_seed: int = 0,
                 train_split: str = "train", val_split: str = "val") -> None:
        require()
        if dataset not in DATASET_MODES:
            raise bad_choice("data.dataset", dataset, DATASET_MODES)
        self.mode = dataset
        self.config, self.preset, self.cfg_options = config, preset, cfg_options
        self.cache_dir = Path(cache_dir).expanduser()
        self.splits = (train_split, val_split)
        self.cfg = load_config(config, preset, cfg_options)  # errors (bad name, bad options) before any work
        self.nuscenes = None
        self.ann_files: dict[str, Path] = {}
        self.prepare_s: float | None = None
        if self.mode == "embedded":
            kind = innermost(self.cfg.train_dataloader.dataset).get("type")
            if kind != "NuScenesDataset":
                raise ConfigError(f"data.dataset=embedded puts drivebench's nuScenes set under a nuScenes config; "
                                  f"{Path(self.cfg._drivebench['config_path']).name} trains on {kind}: use "
                                  "data.dataset=config (its own data paths) or a *_nus-3d config")
            from drivebench.data.sources import NuScenesSource

            self.nuscenes = NuScenesSource(root=root, size=size, cache_dir=cache_dir, version=version, seed=seed,
                                           image_size=image_size, on_corrupt=on_corrupt, run_seed=run_seed)

    # ---- DataSource ---------------------------------------------------------------------------
    def prepare(self, workers: int, progress: bool) -> None:
        t0 = time.perf_counter()
        if self.nuscenes is not None:
            self.nuscenes.prepare(workers, progress)
            self.ann_files = write_infos(self.nuscenes.infos, self.splits, self.cache_dir)
        self.prepare_s = time.perf_counter() - t0

    def dataset_cfg(self, split: str, train: bool) -> dict:
        """The mmdet3d dataset config of one split (a plain dict, for DATASETS.build or a Runner)."""
        from mmengine.config import ConfigDict

        base = self.cfg.train_dataloader.dataset if train else (self.cfg.get("val_dataloader") or {}).get("dataset")
        if base is None:
            raise ConfigError(f"{self.config}: the config has no val_dataloader; set bench.val_batches=0")
        out = ConfigDict(base).to_dict() if isinstance(base, ConfigDict) else dict(base)
        node = innermost(out)
        if not train:  # the loss on the validation split: annotations loaded, no random augmentation
            node["pipeline"] = loss_pipeline(innermost(self.cfg.train_dataloader.dataset)["pipeline"])
            node["test_mode"] = False
        if self.nuscenes is not None:
            if not self.ann_files:
                raise RuntimeError("prepare() first: the info files are written there")
            node["data_root"] = str(self.nuscenes.root)
            node["ann_file"] = str(self.ann_files[split])
            node["data_prefix"] = {**dict(node.get("data_prefix") or {}), **embedded_prefix()}
        return out

    def dataset(self, split: str, transform: Any, accel: Any, train: bool, progress: bool) -> Any:
        if transform is not None:
            raise ConfigError("model=mmdet3d takes its transforms from the mmdet3d config; set model.transform=null")
        if self.nuscenes is not None and not self.ann_files:
            self.prepare(accel.preprocess_workers, progress)
        register_mmdet3d()
        from mmdet3d.registry import DATASETS

        dataset = DATASETS.build(self.dataset_cfg(split, train))
        if len(dataset) == 0:
            raise ConfigError(f"data=mmdet3d: the {split} split has no usable samples (all filtered out?)")
        return dataset

    def describe(self) -> dict[str, Any]:
        info: dict[str, Any] = {
            "name": self.name, "dataset": self.mode, "config": self.cfg._drivebench["config_path"],
            "dataset_type": innermost(self.cfg.train_dataloader.dataset).get("type"),
            "ann_files": {k: str(v) for k, v in self.ann_files.items()}, "prepare_s": self.prepare_s,
        }
        if self.nuscenes is not None:
            info["nuscenes"] = self.nuscenes.describe()
        return info
