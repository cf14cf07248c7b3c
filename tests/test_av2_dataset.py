"""Argoverse2Dataset and the generic preprocessing cache: reuse, repair, parallel == serial, errors."""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import assert_same

from drivebench.data.argoverse2.dataset import Argoverse2Dataset
from drivebench.data.argoverse2.generate import generate_av2
from drivebench.data.preprocess import cache_key, cache_path, load_cached, preprocess_all

REAL_SPLIT = Path(__file__).parent / "fixtures" / "av2-real" / "split"


@pytest.fixture(scope="module")
def mini_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate_av2(tmp_path_factory.mktemp("av2") / "mini", size="mini", seed=0, workers=0, progress=False)


def test_dataset_lists_sorted_ids_and_returns_raw_scenarios(mini_root: Path, tmp_path: Path) -> None:
    dataset = Argoverse2Dataset(mini_root, "val", tmp_path / "cache", progress=False)
    ids = sorted(p.name for p in (mini_root / "val").iterdir())
    assert len(dataset) == len(ids) == 16
    assert [dataset.scenario_id(i) for i in range(len(dataset))] == ids
    assert [dataset[i]["scenario_id"] for i in range(len(dataset))] == ids
    assert dataset.preprocess_stats.built == 16 and dataset.preprocess_stats.reused == 0
    with pytest.raises(IndexError):
        dataset[len(dataset)]

    shaped = Argoverse2Dataset(mini_root, "val", tmp_path / "cache", progress=False, limit=3,
                               transform=lambda raw: raw["agent"]["num_nodes"])
    assert len(shaped) == 3 and shaped.preprocess_stats.reused == 3
    assert shaped[1] == dataset.load_raw(1)["agent"]["num_nodes"]


def test_cache_is_reused_and_damaged_files_are_rebuilt(mini_root: Path, tmp_path: Path) -> None:
    first = Argoverse2Dataset(mini_root, "train", tmp_path / "cache", progress=False)
    n = len(first)
    assert (first.preprocess_stats.built, first.preprocess_stats.reused) == (n, 0)
    reference = [first.load_raw(i) for i in range(n)]

    second = Argoverse2Dataset(mini_root, "train", tmp_path / "cache", progress=False)
    assert (second.preprocess_stats.built, second.preprocess_stats.reused) == (0, n)

    # A truncated file (an interrupted write by another tool) is found by the framing check ...
    truncated = cache_path(tmp_path / "cache", second.key, second.scenario_id(3))
    truncated.write_bytes(truncated.read_bytes()[:100])
    # ... a file damaged inside is found when it is unpickled.
    damaged = cache_path(tmp_path / "cache", second.key, second.scenario_id(5))
    data = bytearray(damaged.read_bytes())
    data[2:40] = b"\xff" * 38
    damaged.write_bytes(bytes(data))

    third = Argoverse2Dataset(mini_root, "train", tmp_path / "cache", progress=False)
    assert (third.preprocess_stats.built, third.preprocess_stats.reused) == (1, n - 1)
    assert_same(third[3], reference[3])
    assert_same(third[5], reference[5])  # rebuilt on load, not used damaged
    with open(damaged, "rb") as handle:
        assert_same(pickle.load(handle), reference[5])


def test_parallel_preprocessing_equals_serial(mini_root: Path, tmp_path: Path) -> None:
    serial = Argoverse2Dataset(mini_root, "val", tmp_path / "serial", preprocess_workers=0, progress=False)
    parallel = Argoverse2Dataset(mini_root, "val", tmp_path / "parallel", preprocess_workers=2, progress=False)
    assert parallel.preprocess_stats.workers == 2 and parallel.preprocess_stats.built == len(parallel)
    assert serial.key == parallel.key
    for i in range(len(serial)):
        assert_same(serial[i], parallel[i], serial.scenario_id(i))


def test_cache_key_follows_the_listing(mini_root: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(mini_root, copy)
    before = Argoverse2Dataset(copy, "val", tmp_path / "cache", progress=False)
    shutil.rmtree(copy / "val" / before.scenario_id(0))
    after = Argoverse2Dataset(copy, "val", tmp_path / "cache", progress=False)
    assert after.key != before.key and len(after) == len(before) - 1
    assert cache_key(a=1, b=[2, 3]) == cache_key(b=[2, 3], a=1) != cache_key(a=1, b=[3, 2])


def test_real_fixture_through_the_dataset(tmp_path: Path) -> None:
    dataset = Argoverse2Dataset(REAL_SPLIT.parent, REAL_SPLIT.name, tmp_path / "cache", progress=False)
    assert len(dataset) == 1
    raw = dataset[0]
    assert raw["city"] == "austin" and raw["map_polygon"]["num_nodes"] == 83


def test_bad_roots_give_named_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"data.root=.*nope does not exist"):
        Argoverse2Dataset(tmp_path / "nope", "train", tmp_path / "cache", progress=False)
    (tmp_path / "flat").mkdir()
    with pytest.raises(FileNotFoundError, match="does not look like Argoverse 2 motion forecasting: expected"):
        Argoverse2Dataset(tmp_path / "flat", "train", tmp_path / "cache", progress=False)
    (tmp_path / "flat" / "train" / "some-folder").mkdir(parents=True)
    (tmp_path / "flat" / "train" / "some-folder" / "data.csv").write_text("x")
    with pytest.raises(FileNotFoundError, match=r"expected .*some-folder/scenario_some-folder.parquet"):
        Argoverse2Dataset(tmp_path / "flat", "train", tmp_path / "cache", progress=False)


def test_corrupt_parquet_is_named_even_from_a_worker_pool(mini_root: Path, tmp_path: Path) -> None:
    from drivebench.data.argoverse2.scenario import Argoverse2FormatError

    copy = tmp_path / "copy"
    shutil.copytree(mini_root / "val", copy / "val")
    victim = sorted((copy / "val").iterdir())[2]
    (victim / f"scenario_{victim.name}.parquet").write_bytes(b"PAR1 not really parquet")
    for workers in (0, 2):
        with pytest.raises(Argoverse2FormatError, match=f"cannot read .*scenario_{victim.name}.parquet"):
            Argoverse2Dataset(copy, "val", tmp_path / f"cache{workers}", preprocess_workers=workers, progress=False)


def _square(x: int) -> dict:
    return {"x": x, "square": np.array([x * x])}


def test_preprocess_all_generic_items(tmp_path: Path) -> None:
    stats = preprocess_all(list(range(6)), _square, tmp_path, "k1", workers=2, progress=False)
    assert (stats.built, stats.reused, stats.workers) == (6, 0, 2) and stats.seconds >= 0
    again = preprocess_all(list(range(8)), _square, tmp_path, "k1", workers=0, progress=False)
    assert (again.built, again.reused) == (2, 6)
    assert load_cached(cache_path(tmp_path, "k1", "7"))["square"][0] == 49
    assert not list((tmp_path / "k1").glob("*.tmp")), "no temporary files left behind"
    broken = cache_path(tmp_path, "k1", "4")
    broken.write_bytes(b"\x80\x05garbage.")
    with pytest.raises(RuntimeError, match="is damaged"):
        load_cached(broken)
    assert load_cached(broken, rebuild=lambda: _square(4))["x"] == 4
    with pytest.raises(ValueError, match="not unique"):
        preprocess_all([1, 1], _square, tmp_path, "k2", progress=False)
