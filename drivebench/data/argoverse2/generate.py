"""The embedded Argoverse 2 motion-forecasting set: synthetic scenarios in the real file format.

Why: the real dataset cannot be downloaded everywhere drivebench runs, yet the loader, the
preprocessing and the model should run unchanged on both. ``generate_av2`` writes
``<root>/<split>/<id>/scenario_<id>.parquet`` + ``log_map_archive_<id>.json`` that av2's own
``load_argoverse_scenario_parquet`` and ``ArgoverseStaticMap.from_json`` read. Every scenario
is a function of (seed, split, index) only, so the output does not depend on the worker count.

The manifest (``drivebench_manifest.json``) is written last: its presence with the same
generator version, size (and size parameters) and seed means the set is complete; anything else
is regenerated.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
import uuid
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path


import numpy as np

from drivebench.accel.threads import pool_kwargs
from drivebench.data.argoverse2 import schema
from drivebench.data.argoverse2.format_writer import CityFrame, ScenarioMeta, map_json, write_scenario
from drivebench.data.argoverse2.synthetic_map import NetworkSize, build_network
from drivebench.data.argoverse2.synthetic_traffic import TrafficSize, generate_tracks
from drivebench.data.preprocess import pool_context
from drivebench.locks import exclusive_lock

log = logging.getLogger(__name__)

GENERATOR_VERSION = "av2-synthetic-1"  # bump when generated content changes for the same size and seed
MANIFEST_NAME = "drivebench_manifest.json"
IN_PROGRESS_NAME = ".drivebench_generating"
SPLITS = ("train", "val")
_SPLIT_CODES = {"train": 1, "val": 2}
_MAX_ATTEMPTS = 20


@dataclass(frozen=True)
class DatasetSize:
    """How many scenarios per split, and how large each scene is."""

    train: int
    val: int
    network: NetworkSize
    traffic: TrafficSize
    center_spacing: float  # metres between written centerline points

    def count(self, split: str) -> int:
        return {"train": self.train, "val": self.val}[split]


SIZES: dict[str, DatasetSize] = {
    # CPU tests: one small intersection, 10-20 agents, 30-60 map polygons; seconds to make.
    "mini": DatasetSize(
        train=32, val=16,
        network=NetworkSize(intersections=1, lanes_per_direction=(1,), lane_weights=(1.0,), arm_length=(70.0, 100.0),
                            link_length=(0.0, 0.0), segment_length=(20.0, 30.0), bike_lane_prob=0.0, tee_prob=0.0,
                            max_curvature=1 / 150),
        traffic=TrafficSize(queue_prob=0.75, departure_queue_prob=0.5, headway=(1.2, 2.5), pedestrians=(3, 6),
                            cyclists=(0, 1), parked=(1, 3), static=(1, 3), view_radius=(65.0, 85.0), max_scored=3),
        center_spacing=5.0,
    ),
    # Realistic size, like real Argoverse 2 scenes: two intersections, ~50-70 agents,
    # ~150-250 map polygons and ~1,200-1,800 map points after loading.
    "bench": DatasetSize(
        train=1000, val=200,
        network=NetworkSize(intersections=2, lanes_per_direction=(1, 2, 3), lane_weights=(0.2, 0.5, 0.3),
                            arm_length=(75.0, 115.0), link_length=(60.0, 100.0), segment_length=(20.0, 30.0),
                            bike_lane_prob=0.35, tee_prob=0.25, max_curvature=1 / 180),
        traffic=TrafficSize(queue_prob=0.65, departure_queue_prob=0.5, headway=(1.2, 2.5), pedestrians=(16, 26),
                            cyclists=(1, 4), parked=(6, 14), static=(6, 14), view_radius=(110.0, 150.0), max_scored=6),
        center_spacing=6.0,
    ),
}


def scenario_rng(seed: int, split: str, index: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([seed, _SPLIT_CODES[split], index]))


def scenario_id_for(seed: int, split: str, index: int) -> str:
    """A UUID-like id that depends on (seed, split, index) only."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, _SPLIT_CODES[split], index, 7]))
    return str(uuid.UUID(bytes=rng.bytes(16), version=4))


def generate_scenario(root: Path, size_name: str, seed: int, split: str, index: int) -> str:
    """Write one scenario; top level so that process pools can run it. Returns its id."""
    size = SIZES[size_name]
    rng = scenario_rng(seed, split, index)
    for _ in range(_MAX_ATTEMPTS):
        network = build_network(rng, size.network)
        tracks = generate_tracks(network, rng, size.traffic)
        if tracks is not None:
            break
    else:
        raise RuntimeError(f"no usable scenario for seed={seed} split={split} index={index} "
                           f"after {_MAX_ATTEMPTS} draws; the size {size_name!r} is too sparse")
    scenario_id = scenario_id_for(seed, split, index)
    frame = CityFrame.random(rng)
    meta = ScenarioMeta(
        scenario_id=scenario_id,
        city=str(rng.choice(schema.CITIES)),
        start_timestamp_ns=int(315_900_000_000_000_000 + rng.integers(0, 10**17)),
        map_id=int(rng.integers(1, 100_000)),
        slice_id=str(uuid.UUID(bytes=rng.bytes(16), version=4)),
    )
    write_scenario(Path(root) / split / scenario_id, meta, tracks,
                   map_json(network, frame, rng, size.center_spacing), frame)
    return scenario_id


def _generate_chunk(args: tuple[str, str, int, str, list[int]]) -> int:
    root, size_name, seed, split, indices = args
    for index in indices:
        generate_scenario(Path(root), size_name, seed, split, index)
    return len(indices)


def _manifest(size_name: str, seed: int) -> dict:
    size = SIZES[size_name]
    return {"generator_version": GENERATOR_VERSION, "size": size_name, "seed": seed,
            "counts": {split: size.count(split) for split in SPLITS},
            "size_spec": asdict(size)}


def read_manifest(root: Path) -> dict | None:
    try:
        return json.loads((Path(root) / MANIFEST_NAME).read_text())
    except (OSError, ValueError):
        return None


def generate_av2(root: Path, size: str = "bench", seed: int = 0, workers: int = 0, progress: bool = True) -> Path:
    """Write the embedded set of ``size`` into ``root`` (train and val) and return ``root``.

    ``workers>0`` spreads scenarios over a process pool. The manifest is written last.
    """
    if size not in SIZES:
        raise ValueError(f"size={size!r} is not an embedded Argoverse 2 size; choose one of {', '.join(SIZES)}")
    root = Path(root)
    _claim_root(root)
    (root / MANIFEST_NAME).unlink(missing_ok=True)
    (root / IN_PROGRESS_NAME).write_text("generation started; incomplete until drivebench_manifest.json exists\n")
    start = time.perf_counter()
    jobs = []
    chunk = 8
    for split in SPLITS:
        n = SIZES[size].count(split)
        jobs += [(str(root), size, seed, split, list(range(i, min(i + chunk, n)))) for i in range(0, n, chunk)]
    total = sum(len(job[-1]) for job in jobs)
    bar = _progress_bar(total, f"generate argoverse2 {size}", progress)
    try:
        if workers > 0:
            with ProcessPoolExecutor(max_workers=workers, mp_context=pool_context(), **pool_kwargs()) as pool:
                for done in pool.map(_generate_chunk, jobs):
                    bar.update(done)
        else:
            for job in jobs:
                bar.update(_generate_chunk(job))
    finally:
        bar.close()
    manifest = _manifest(size, seed)
    manifest["seconds"] = round(time.perf_counter() - start, 2)
    manifest["workers"] = workers
    (root / MANIFEST_NAME).write_text(json.dumps(manifest, indent=1))
    (root / IN_PROGRESS_NAME).unlink(missing_ok=True)
    return root


def _progress_bar(total: int, desc: str, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="scenario", disable=not enabled, dynamic_ncols=True)


def manifest_matches(root: Path, size: str, seed: int) -> bool:
    manifest = read_manifest(root)
    if manifest is None:
        return False
    expected = json.loads(json.dumps(_manifest(size, seed)))  # tuples become lists, as on disk
    return all(manifest.get(key) == value for key, value in expected.items())


def ensure_generated(root: Path, size: str = "bench", seed: int = 0, workers: int = 0, progress: bool = True) -> Path:
    """Return ``root`` at once if it holds this exact set (same manifest); otherwise (re)generate it.

    Processes on one host that call this together (DDP ranks) take turns through a file lock
    beside ``root``: the first generates, the others then find the manifest.
    """
    root = Path(root)
    if manifest_matches(root, size, seed):
        return root
    with exclusive_lock(root.parent / f".{root.name}.lock"):
        if manifest_matches(root, size, seed):
            return root
        log.info("generating the embedded Argoverse 2 set (%s, seed %d) in %s", size, seed, root)
        return generate_av2(root, size=size, seed=seed, workers=workers, progress=progress)


def _claim_root(root: Path) -> None:
    """Make ``root`` ready for a fresh set: create it, or clear the splits of an earlier set.

    Refuses a non-empty folder that is not a generator output (no manifest and no in-progress
    marker), so a real dataset is never overwritten by mistake.
    """
    if root.exists() and any(root.iterdir()):
        if not ((root / MANIFEST_NAME).exists() or (root / IN_PROGRESS_NAME).exists()):
            raise FileExistsError(
                f"{root} is not empty and is not a drivebench-generated Argoverse 2 set (no {MANIFEST_NAME}); "
                "choose an empty folder for the embedded set, or set data.root to read it as a real dataset"
            )
        for split in SPLITS:
            shutil.rmtree(root / split, ignore_errors=True)
    root.mkdir(parents=True, exist_ok=True)
