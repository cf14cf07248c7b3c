"""QCNet's shape buckets kept between runs (``static_shapes.BucketFile``): a later run with another seed starts from
the buckets earlier runs opened, so it pads to shapes a warm compile cache holds; the file can only add choices."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir

from drivebench.models.qcnet.static_shapes import COUNT_KEYS, BucketFile, ShapeBuckets
from tests.conftest import REPO

SCENE_MEANS = {key: 100 + 37 * i for i, key in enumerate(sorted(COUNT_KEYS))}


def _scenes(count: int = 300) -> list[dict[str, int]]:
    """Per-scene counts of one fixed dataset (every key, as ``batch_counts`` gives them)."""
    rng = np.random.default_rng(7)
    scale = rng.lognormal(0.0, 0.3, count)
    return [{k: max(int(v * s * rng.uniform(0.9, 1.1)), 1) for k, v in SCENE_MEANS.items()} for s in scale]


def _epochs(scenes: list[dict[str, int]], seed: int, epochs: int = 2, batch_size: int = 4):
    """The batches of a few shuffled epochs: what a training run with ``seed`` pads."""
    rng = np.random.default_rng(seed)
    for _ in range(epochs):
        order = rng.permutation(len(scenes))
        for start in range(0, len(order), batch_size):
            members = [scenes[i] for i in order[start:start + batch_size]]
            yield {k: sum(m[k] for m in members) for k in COUNT_KEYS}


def _train(path: Path, seed: int, scenes: list[dict[str, int]]) -> ShapeBuckets:
    buckets = ShapeBuckets(growth=1.15, max_buckets=4)
    buckets.keep_in(BucketFile(path))
    for counts in _epochs(scenes, seed):
        buckets.choose(counts)
    return buckets


def test_later_seeds_pad_to_the_shapes_earlier_runs_opened(tmp_path: Path):
    scenes, path = _scenes(), tmp_path / "shapes" / "qcnet.json"
    alone = {seed: ShapeBuckets(growth=1.15, max_buckets=4) for seed in (1, 2)}
    for seed, buckets in alone.items():
        for counts in _epochs(scenes, seed):
            buckets.choose(counts)
    assert alone[1].buckets != alone[2].buckets  # online buckets follow the batch order: why the file exists

    first = _train(path, 1, scenes)
    assert first.loaded == 0 and json.loads(path.read_text()) == first.buckets
    second = _train(path, 2, scenes)
    assert second.loaded == len(first.buckets)
    assert len(second.buckets) - second.loaded <= 1  # at most the bucket that covers all
    kept = json.loads(path.read_text())
    for seed in (3, 4, 5):  # from now on every seed's batches fit the kept shapes: nothing new to compile
        later = _train(path, seed, scenes)
        assert later.buckets == kept and later.loaded == len(kept)
    assert json.loads(path.read_text()) == kept


def test_a_bad_or_foreign_file_counts_as_empty_and_is_replaced(tmp_path: Path):
    path = tmp_path / "qcnet.json"
    path.write_text("{not json")
    store = BucketFile(path)
    assert store.read() == [] and "qcnet.json" in store.problem
    buckets = ShapeBuckets(growth=1.0, multiple=1)
    buckets.keep_in(store)
    opened = buckets.choose(dict.fromkeys(COUNT_KEYS, 5))
    assert json.loads(path.read_text()) == [opened]

    path.write_text(json.dumps([{"agent": 8, "polygon": 9}, opened]))  # another version's keys: skipped
    assert BucketFile(path).read() == [opened]


def test_writes_add_to_what_another_run_wrote_since(tmp_path: Path):
    path = tmp_path / "qcnet.json"
    ours, theirs = ShapeBuckets(growth=1.0, multiple=1), ShapeBuckets(growth=1.0, multiple=1)
    ours.keep_in(BucketFile(path))
    theirs.keep_in(BucketFile(path))  # both read an empty file
    a = ours.choose(dict.fromkeys(COUNT_KEYS, 5))
    b = theirs.choose(dict.fromkeys(COUNT_KEYS, 50))
    assert json.loads(path.read_text()) == [a, b]
    assert not list(tmp_path.glob(".*.tmp"))


def _store_path(cache: Path, tmp_path: Path, *overrides: str) -> Path | None:
    from drivebench.app import build_run

    with initialize_config_dir(config_dir=str(REPO / "drivebench" / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["model=qcnet", "model.size=test", "data.size=mini", "ckpt=none",
                                                        f"paths.output_dir={tmp_path}", f"paths.cache={cache}",
                                                        f"accel.compile_cache={tmp_path / 'inductor'}", *overrides])
    store = build_run(cfg, tmp_path, progress=False).module.buckets.store
    return store.path if store else None


@pytest.mark.usefixtures("one_torch_thread")
def test_runs_share_a_file_next_to_the_compile_cache_when_their_batches_agree(drivebench_cache: Path, tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)  # build_run points it at the run's cache: restored after
    base = _store_path(drivebench_cache, tmp_path)
    assert base.parent == tmp_path / "inductor" / "drivebench-shapes"
    assert _store_path(drivebench_cache, tmp_path, "seed=5", "accel=max") == base  # seed, knobs: same batches
    assert _store_path(drivebench_cache, tmp_path, "model.batch_size=3") != base
    assert _store_path(drivebench_cache, tmp_path, "model.module.max_buckets=6") != base
