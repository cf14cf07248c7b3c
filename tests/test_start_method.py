"""Loader workers start by fork, and by forkserver in a gloo DDP rank on a Python with CPython gh-112275
(drivebench/start_method.py): the rule against a real gloo process group, and forkserver workers giving
every model the batches forked workers give (their datasets must survive pickling)."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from conftest import assert_same
from hydra import compose, initialize_config_dir

import drivebench.data.datamodule as datamodule_module
from drivebench.app import build_run
from drivebench.start_method import fork_hazard, has_fork_deadlock, worker_start_method

CONF = Path(__file__).resolve().parents[1] / "drivebench" / "conf"
AFFECTED, FIXED, NEWER = (3, 11, 7), (3, 11, 10), (3, 12, 0)


def test_workers_fork_unless_a_gloo_group_runs_on_a_python_with_the_fork_deadlock(tmp_path: Path) -> None:
    assert has_fork_deadlock((3, 10, 14)) and has_fork_deadlock(AFFECTED)
    assert not any(has_fork_deadlock(v) for v in ((3, 10, 15), FIXED, NEWER, (3, 13, 1)))
    assert not dist.is_initialized()
    assert worker_start_method(AFFECTED) == "fork"  # no process group: nothing frees tensors beside the fork
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        dist.all_reduce(torch.ones(3))  # the kind of collective whose finished tensors gloo's threads free
        assert worker_start_method(AFFECTED) == "forkserver"
        assert "gh-112275" in fork_hazard(AFFECTED) and "3.11.10" in fork_hazard(AFFECTED)
        assert worker_start_method(FIXED) == "fork" and worker_start_method(NEWER) == "fork"
        assert fork_hazard(NEWER) is None
    finally:
        dist.destroy_process_group()
    assert worker_start_method(AFFECTED) == "fork"


def _first_batches(cache: Path, tmp_path: Path, model: str, method: str, monkeypatch: pytest.MonkeyPatch) -> list:
    monkeypatch.setattr(datamodule_module, "worker_context", lambda preload: multiprocessing.get_context(method))
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[
            f"model={model}", "model.size=test", "data.size=mini", "accel=max", "accel.num_workers=1",
            "ckpt=none", f"paths.cache={cache}", f"paths.output_dir={tmp_path / method}"])
    dm = build_run(cfg, tmp_path / method, progress=False).datamodule
    assert dm.accel.shm_cache and dm.accel.precompute_targets  # the shared-memory caches travel to the workers too
    dm.prepare_data()
    dm.setup("fit")
    batches = []
    for batch in dm.train_dataloader():
        batches.append(batch)
        if len(batches) == 2:
            break
    val = next(iter(dm.val_dataloader()))
    assert dm.worker_start_method == method
    stats = dm.cache_stats()  # the workers read the parent's shared-memory block, not a copy of their own
    assert stats["enabled"] and stats["hits"] > 0 and stats["misses"] == 0, stats
    dm.teardown("fit")
    return [*batches, val]


@pytest.mark.parametrize("model", ["qcnet", "maptr", "sparsedrive", "gaussianformer"])
def test_forkserver_workers_give_the_batches_forked_workers_give(model: str, drivebench_cache: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    forked = _first_batches(drivebench_cache, tmp_path, model, "fork", monkeypatch)
    served = _first_batches(drivebench_cache, tmp_path, model, "forkserver", monkeypatch)
    assert_same(forked, served, "batches")
