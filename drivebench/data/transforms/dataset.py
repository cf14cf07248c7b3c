"""``NuScenesDataset``: info record -> ``results`` dict -> pipeline -> one sample.

Randomness: ``results["rng"] = np.random.default_rng([seed, epoch, index])``, so a sample's
augmentation depends on (seed, epoch, index) only -- not on the worker, the call order or how many
workers there are. ``results["seq_rng"]`` is seeded by the sequence instead, for augmentations
kept constant over a driving sequence (SparseDrive). The epoch comes with the index from the training
loader (a ``SampleKey``); a plain index uses the epoch last given to ``set_epoch``.

Temporal batches: a batch sampler may yield ``(index, prev_exists)`` pairs; ``prev_exists`` says
the previous key frame of the scene went through the same batch slot. A plain index means False.
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from drivebench.data.nuscenes import CAMERAS
from drivebench.data.nuscenes.errors import DataFileError, MissingFileError
from drivebench.errors import DataError
from drivebench.data.nuscenes.infos import NAME_MAPPING, InfoIndex
from drivebench.data.sampling import unpack_key

log = logging.getLogger(__name__)
SKIP_KINDS = ("missing", "corrupt")  # MissingFileError, any other DataFileError
_LOGGED_SKIPS = 20  # per process: each names its file; the summary counts all
_SKIP_ROWS = 65  # the training process + up to 64 loader workers (more share rows, still counted)


def record_to_results(record: dict, root: Path) -> dict:
    """Everything a pipeline may need from one info record, as numpy arrays and absolute paths."""
    root = Path(root)
    cams = [record["images"][c] for c in CAMERAS]
    cam2img = np.array([c["cam2img"] for c in cams], np.float64)
    lidar2cam = np.array([c["lidar2cam"] for c in cams], np.float64)
    k4 = np.tile(np.eye(4), (len(cams), 1, 1))
    k4[:, :3, :3] = cam2img
    lidar2ego = np.asarray(record["lidar_points"]["lidar2ego"], np.float64)
    ego2global = np.asarray(record["ego2global"], np.float64)
    insts = record["instances"]
    n = len(insts)
    names = np.array([NAME_MAPPING.get(i.get("category_name", ""), None) or _label_name(i) for i in insts], dtype=object)
    occ = record.get("occ_path") or ""
    return {
        "token": record["token"],
        "sample_idx": record["sample_idx"],
        "scene_token": record.get("scene_token", ""),
        "sequence_id": int(record.get("sequence_id", 0)),
        "frame_idx": int(record.get("frame_idx", 0)),
        "timestamp": float(record["timestamp"]),
        "root": str(root),
        "img_paths": [str(root / c["img_path"]) for c in cams],
        "img_hw": [(int(c.get("height", 900)), int(c.get("width", 1600))) for c in cams],
        "cam_intrinsic": cam2img,
        "lidar2cam": lidar2cam,
        "cam2lidar": np.linalg.inv(lidar2cam),
        "lidar2img": k4 @ lidar2cam,
        "lidar2ego": lidar2ego,
        "ego2global": ego2global,
        "lidar2global": ego2global @ lidar2ego,
        "can_bus": np.asarray(record.get("can_bus", np.zeros(18)), np.float64),
        "map_location": record.get("map_location", ""),
        "lidar_path": str(root / record["lidar_points"]["lidar_path"]),
        "sweeps": record.get("lidar_sweeps", []),
        "occ_path": str(root / occ) if occ else "",
        "gt_names": names,
        "gt_bboxes": np.array([i["bbox_3d"] for i in insts], np.float64).reshape(n, 7),
        "gt_velocity": np.array([i.get("velocity", [0.0, 0.0]) for i in insts], np.float64).reshape(n, 2),
        "num_lidar_pts": np.array([i.get("num_lidar_pts", 0) for i in insts], np.int64),
        "valid_flag": np.array([i.get("bbox_3d_isvalid", True) for i in insts], bool),
        "instance_ids": np.array([i.get("instance_id", -1) for i in insts], np.int64),
        "gt_attribute_names": np.array([i.get("attribute_name", "") for i in insts], dtype=object),
        "agent_fut_trajs": np.array([i.get("fut_trajs", np.zeros((12, 2))) for i in insts], np.float64).reshape(n, 12, 2),
        "agent_fut_masks": np.array([i.get("fut_masks", np.zeros(12)) for i in insts], np.float64).reshape(n, 12),
        "ego_fut_steps": record.get("gt_ego_fut_trajs", np.zeros((6, 2))),
        "ego_fut_masks": record.get("gt_ego_fut_masks", np.zeros(6)),
        "ego_fut_cmd": record.get("gt_ego_fut_cmd", [0.0, 0.0, 1.0]),
        "ego_status_raw": record.get("ego_status", np.zeros(10)),
    }


_MMDET3D_CLASSES = ("car", "truck", "trailer", "bus", "construction_vehicle", "bicycle", "motorcycle", "pedestrian",
                    "traffic_cone", "barrier")


def _label_name(inst: dict) -> str:
    """Detection name of an instance without ``category_name`` (infos from mmdet3d's converter)."""
    label = inst.get("bbox_label_3d", -1)
    return _MMDET3D_CLASSES[label] if 0 <= label < len(_MMDET3D_CLASSES) else "ignore"


class NuScenesDataset(Dataset):
    """Map-style dataset over info records; ``on_corrupt="skip"`` replaces a sample whose files are
    missing or corrupt by the next good one and counts it in ``self.skipped`` (per process)."""

    accepts_sample_keys = True  # __getitem__ takes a SampleKey (index + epoch) from the training loader

    def __init__(
        self,
        infos: Sequence[dict] | InfoIndex,
        pipeline: Sequence[Callable[[dict], dict]],
        seed: int = 0,
        root: str | Path | None = None,
        on_corrupt: str = "fail",
        max_skips: int = 16,
    ) -> None:
        if on_corrupt not in ("fail", "skip"):
            raise ValueError(f"on_corrupt={on_corrupt!r} is not valid; choose fail or skip")
        records = infos.records if isinstance(infos, InfoIndex) else list(infos)
        if not records:
            raise ValueError("NuScenesDataset got no info records: check the split name and the data root")
        if root is None:
            raise ValueError("NuScenesDataset needs root= (the nuScenes dataroot the info paths are relative to)")
        self.records = records
        self.pipeline = list(pipeline)
        self.seed = int(seed)
        self.root = Path(root)
        self.on_corrupt = on_corrupt
        self.max_skips = max_skips
        self.epoch = 0
        self.skipped: Counter = Counter()  # by problem, in this process
        # by kind (missing, corrupt) and process: one row per loader worker (each writes its own row, so no
        # lock), row 0 for the training process; shared memory, so the training process sees every worker's
        self._skip_counts = torch.zeros(_SKIP_ROWS, len(SKIP_KINDS), dtype=torch.int64).share_memory_()

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return len(self.records)

    def results_for(self, index: int, prev_exists: bool = False, epoch: int | None = None) -> dict:
        rec = self.records[index]
        results = record_to_results(rec, self.root)
        epoch = self.epoch if epoch is None else int(epoch)
        results["rng"] = np.random.default_rng([self.seed, epoch, index])
        results["seq_rng"] = np.random.default_rng([self.seed, epoch, results["sequence_id"], 1 << 20])
        results["prev_exists"] = bool(prev_exists)
        return results

    def run(self, index: int, prev_exists: bool = False, epoch: int | None = None) -> dict:
        results = self.results_for(index, prev_exists, epoch)
        for t in self.pipeline:
            results = t(results)
        return results

    def __getitem__(self, item) -> dict:
        index, epoch, prev_exists = unpack_key(item)
        for attempt in range(self.max_skips + 1):
            try:
                return self.run((index + attempt) % len(self), prev_exists and attempt == 0, epoch)
            except DataFileError as err:
                if self.on_corrupt == "fail":
                    raise
                self._count_skip(err)
                last = err
        raise DataError(f"{self.max_skips + 1} samples in a row from index {index} have bad files (the last: {last}); "
                        "the data is damaged beyond skipping: restore it, or check data.root")

    def _count_skip(self, err: DataFileError) -> None:
        self.skipped[err.problem] += 1
        info = torch.utils.data.get_worker_info()
        row = 0 if info is None else 1 + info.id % (_SKIP_ROWS - 1)
        self._skip_counts[row, SKIP_KINDS.index("missing" if isinstance(err, MissingFileError) else "corrupt")] += 1
        seen = sum(self.skipped.values())
        if seen <= _LOGGED_SKIPS:
            log.warning("data.on_corrupt=skip: skipped a sample: %s%s", err, "" if seen < _LOGGED_SKIPS else
                        " (further skips in this process are counted, not logged: summary data.skipped_in_training)")

    def skip_counts(self) -> dict[str, int]:
        """Samples skipped so far (``on_corrupt=skip``) by kind, over the training process and every loader
        worker: what the summary reports as ``data.skipped_in_training``."""
        totals = self._skip_counts.sum(0).tolist()
        return {kind: int(n) for kind, n in zip(SKIP_KINDS, totals)}
