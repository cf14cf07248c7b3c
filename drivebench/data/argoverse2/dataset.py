"""Argoverse 2 motion forecasting as a torch Dataset over cached RawScenarios.

Why the split between preprocessing and ``__getitem__``: the conversion from files to arrays
(parquet + map JSON through av2) costs tens of milliseconds per scenario and never changes for
a given converter version, so it runs once (optionally in a process pool) into a pickle cache;
a training step then only unpickles a few hundred kilobytes and applies the model's transform.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from torch.utils.data import Dataset

from drivebench.data.argoverse2 import schema
from drivebench.data.argoverse2.generate import read_manifest
from drivebench.data.argoverse2.scenario import CONVERTER_VERSION, load_scenario_dir
from drivebench.data.preprocess import PreprocessStats, cache_key, cache_path, load_cached, preprocess_all
from drivebench.data.sampling import unpack_key
from drivebench.errors import MissingDataError


def list_scenarios(root: Path, split: str) -> list[Path]:
    """Scenario directories of ``<root>/<split>``, sorted by id; one-line errors for bad layouts."""
    root = Path(root)
    if not root.is_dir():
        raise MissingDataError(
            f"data.root={root} does not exist: expected an Argoverse 2 motion-forecasting folder laid out as "
            f"{schema.LAYOUT_HINT}"
        )
    split_dir = root / split
    if not split_dir.is_dir():
        raise MissingDataError(
            f"data.root={root} does not look like Argoverse 2 motion forecasting: expected "
            f"{split_dir}/<id>/scenario_<id>.parquet (no folder {split_dir})"
        )
    scenario_dirs = sorted((p for p in split_dir.iterdir() if p.is_dir()), key=lambda p: p.name)
    if not scenario_dirs:
        raise MissingDataError(
            f"data.root={root} does not look like Argoverse 2 motion forecasting: expected "
            f"{split_dir}/<id>/scenario_<id>.parquet (no scenario folders in {split_dir})"
        )
    first = scenario_dirs[0]
    if not (first / schema.scenario_parquet_name(first.name)).is_file():
        raise MissingDataError(
            f"data.root={root} does not look like Argoverse 2 motion forecasting: expected "
            f"{first / schema.scenario_parquet_name(first.name)}"
        )
    return scenario_dirs


def _generator_identity(root: Path) -> dict | None:
    """What made an embedded set (None for real data): part of the cache key."""
    manifest = read_manifest(root)
    if manifest is None:
        return None
    return {key: manifest.get(key) for key in ("generator_version", "size", "seed", "counts", "size_spec")}


class Argoverse2Dataset(Dataset):
    """Scenarios of one split, preprocessed once into ``cache_dir`` (see ``schema`` for RawScenario).

    Args:
        root: folder with ``<split>/<id>/scenario_<id>.parquet`` + ``log_map_archive_<id>.json``.
        split: split folder name (train, val, test).
        cache_dir: preprocessing cache; results go to ``cache_dir/<key>/<id>.pkl`` where the key
            hashes the converter version, the root, the split and its listing (and the generator
            manifest for the embedded set), so a changed dataset never reuses stale results.
        transform: applied to the RawScenario in ``__getitem__`` (the model's target/graph builder);
            None returns the RawScenario.
        preprocess_workers: 0 converts serially in this process, >0 uses a process pool.
        progress: show a progress bar while converting.
        limit: use only the first ``limit`` scenarios (sorted by id).
    """

    def __init__(self, root: Path, split: str, cache_dir: Path, transform: Callable[[dict], Any] | None = None,
                 preprocess_workers: int = 0, progress: bool = True, limit: int | None = None) -> None:
        self.root = Path(root)
        self.split = split
        self.transform = transform
        scenario_dirs = list_scenarios(self.root, split)
        self.key = cache_key(
            converter=CONVERTER_VERSION,
            root=str(self.root.resolve()),
            split=split,
            listing=cache_key(ids=[p.name for p in scenario_dirs]),
            generator=_generator_identity(self.root),
        )
        self.scenario_dirs = scenario_dirs if limit is None else scenario_dirs[:limit]
        self.cache_dir = Path(cache_dir)
        self.preprocess_stats: PreprocessStats = preprocess_all(
            self.scenario_dirs, load_scenario_dir, self.cache_dir, self.key, workers=preprocess_workers,
            progress=progress, desc=f"preprocess argoverse2 {split}",
        )

    def __len__(self) -> int:
        return len(self.scenario_dirs)

    def scenario_id(self, index: int) -> str:
        return self.scenario_dirs[index].name

    def load_raw(self, index: int) -> dict[str, Any]:
        """The cached RawScenario of sample ``index`` (rebuilt if its cache file is damaged)."""
        scenario_dir = self.scenario_dirs[index]
        return load_cached(cache_path(self.cache_dir, self.key, scenario_dir.name),
                           rebuild=lambda: load_scenario_dir(scenario_dir))

    accepts_sample_keys = True

    def __getitem__(self, item: Any) -> Any:
        index = unpack_key(item)[0]  # no augmentation here: the epoch does not matter
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} {self.split} scenarios")
        raw = self.load_raw(index)
        return raw if self.transform is None else self.transform(raw)
