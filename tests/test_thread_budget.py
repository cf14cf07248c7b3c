"""accel.threads: the usable cores (affinity, cgroup quota), the budget it resolves to, and the thread
counts that real loader workers and the training process under a Lightning fit then run with."""

from __future__ import annotations

import os
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from torch.utils.data import Dataset

from drivebench.accel import threads as T
from drivebench.accel.settings import AccelSettings
from drivebench.data.datamodule import DriveDataModule
from drivebench.errors import ConfigError
from drivebench.lit.base import DriveModule
from drivebench.perf import machine as M

from dataset_source import DatasetSource

CONF = Path(__file__).resolve().parents[1] / "drivebench" / "conf"


def accel_preset(name: str, *overrides: str) -> dict:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"accel={name}", *overrides])
    return OmegaConf.to_container(cfg.accel, resolve=True)


@pytest.fixture
def fake_cores(monkeypatch, tmp_path):
    """``fake_cores(n)``: this process's affinity is n CPUs of a 64-CPU host, no cgroup quota."""
    (tmp_path / "cgroup").write_text("0::/\n")
    real = M.usable_cores
    monkeypatch.setattr(M, "usable_cores", lambda: real(tmp_path / "cgroup", tmp_path))

    def set_cores(n: int) -> None:
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(n)))
        monkeypatch.setattr(os, "cpu_count", lambda: 64)

    yield set_cores
    T.restore_original()  # later tests in this process: the counts they had before


# ---- the usable cores ---------------------------------------------------------------------------------
def test_affinity_not_cpu_count_is_the_core_count(monkeypatch, tmp_path):
    (tmp_path / "cgroup").write_text("0::/\n")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    count = M.usable_cores(tmp_path / "cgroup", tmp_path)
    assert (count.cores, count.affinity, count.cpu_count, count.quota_cpus) == (2, 2, 64, None)
    assert count.source == "affinity (2 of 64 CPUs)"


def test_a_cgroup_v2_quota_below_the_affinity_wins_also_from_a_parent(monkeypatch, tmp_path):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    (tmp_path / "cgroup").write_text("0::/job/step\n")
    (tmp_path / "job" / "step").mkdir(parents=True)
    (tmp_path / "cpu.max").write_text("max 100000\n")
    (tmp_path / "job" / "cpu.max").write_text("250000 100000\n")  # 2.5 CPUs for the whole job
    (tmp_path / "job" / "step" / "cpu.max").write_text("max 100000\n")
    count = M.usable_cores(tmp_path / "cgroup", tmp_path)
    assert count.cores == 2 and count.quota_cpus == 2.5
    assert "job/cpu.max 250000 100000" in count.source and "below the affinity of 16" in count.source


def test_a_cgroup_v1_cfs_quota_counts_and_minus_one_means_none(monkeypatch, tmp_path):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    (tmp_path / "cgroup").write_text("4:memory:/x\n3:cpu,cpuacct:/\n")
    v1 = tmp_path / "cpu,cpuacct"
    v1.mkdir()
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    (v1 / "cpu.cfs_quota_us").write_text("-1\n")
    assert M.usable_cores(tmp_path / "cgroup", tmp_path).cores == 8
    (v1 / "cpu.cfs_quota_us").write_text("300000\n")
    count = M.usable_cores(tmp_path / "cgroup", tmp_path)
    assert count.cores == 3 and "cpu.cfs_quota_us 300000/100000" in count.source


# ---- the budget ---------------------------------------------------------------------------------------
def test_auto_gives_the_training_process_the_cores_its_workers_leave():
    fits = T.ThreadBudget.plan("auto", 8, "affinity", 1, loader_workers=4, pool_workers=8)
    assert (fits.training_threads, fits.worker_threads, fits.interop_threads, fits.pool_threads) == (4, 1, 1, 1)
    assert fits.to_dict()["fits"] and fits.to_dict()["threads_beside_training"] == 8
    crowded = T.ThreadBudget.plan("auto", 2, "affinity", 1, loader_workers=4, pool_workers=2)
    record = crowded.to_dict()
    assert crowded.training_threads == 1 and record["fits"] is False
    assert "loader workers alone take every core" in record["note"] and "accel.num_workers=1 fits" in record["note"]
    two_ranks = T.ThreadBudget.plan("auto", 16, "affinity", 2, loader_workers=3, pool_workers=0)
    assert (two_ranks.cores, two_ranks.training_threads) == (8, 5)  # each rank's share of the cores
    fixed = T.ThreadBudget.plan(3, 2, "affinity", 1, loader_workers=1, pool_workers=0)
    assert fixed.training_threads == 3 and "accel.threads=auto fits" in fixed.note()
    default = T.ThreadBudget.plan("default", 2, "affinity", 1, loader_workers=1, pool_workers=0)
    assert (default.training_threads, default.worker_threads, default.pool_threads) == (None, None, None)


@pytest.mark.parametrize("value", ["many", 0, -2, True, 1.5])
def test_bad_thread_values_name_the_key(value):
    with pytest.raises(ConfigError, match=r"accel\.threads=.* is not valid; use auto, default or a whole number"):
        T.check_knob(value)


def test_presets_none_keeps_pytorchs_defaults_cpu_and_max_budget():
    machine = M.MachineInfo(hostname="h", cpu_model="x", cpu_cores=2, ram_gb=8, shm_gb=1, shm_free_gb=1,
                            accelerator="cpu")
    assert AccelSettings.resolve(accel_preset("none"), machine).threads == "default"
    assert AccelSettings.resolve(accel_preset("cpu"), machine).threads == 2  # no loader workers
    assert AccelSettings.resolve(accel_preset("max"), machine).threads == 1  # one worker, one training thread
    assert AccelSettings.resolve(accel_preset("none", "accel.threads=3"), machine).threads == 3


# ---- real workers and a real trainer ------------------------------------------------------------------
class ThreadReport(Dataset):
    """Each sample: the thread counts of the process that loaded it (a loader worker)."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> dict:
        seen = T.in_effect()
        return {"x": torch.ones(2), "worker_intra": seen["torch_intra_op"], "worker_inter": seen["torch_inter_op"],
                "worker_blas": seen["blas"] or 0, "worker_pid": os.getpid()}


class Recorder(DriveModule):
    """Records, inside Lightning's training loop, the trainer's and the workers' thread counts."""

    def __init__(self) -> None:
        super().__init__(torch.nn.Linear(2, 1), optimizer=lambda p: torch.optim.SGD(p, lr=0.1))
        self.seen: list[dict] = []

    def compute_loss(self, batch, outputs):
        self.seen.append({"trainer_intra": torch.get_num_threads(),
                          **{k: batch[k].tolist() for k in ("worker_intra", "worker_inter", "worker_blas", "worker_pid")}})
        return {"loss": outputs.pow(2).mean()}

    def forward(self, batch):
        return self.net(batch["x"])

    def batch_size(self, batch):
        return batch["x"].shape[0]


def fit_within_budget(cores: int, *overrides: str) -> tuple[T.ThreadBudget, list[dict]]:
    """As ``app.build_run`` does: detect the machine, resolve accel, apply the budget, then train."""
    machine = M.detect_machine("cpu")
    assert machine.cpu_cores == cores and machine.cpu_cores_source == f"affinity ({cores} of 64 CPUs)"
    cfg = accel_preset("max", "accel.num_workers=4", "accel.prefetch_across_epochs=false", *overrides)
    accel = AccelSettings.resolve(cfg, machine, processes=1)
    budget = accel.thread_budget(cfg["threads"], machine, processes=1).apply()
    dm = DriveDataModule(DatasetSource(ThreadReport()), None, None, batch_size=4, val_batch_size=4, accel=accel,
                         progress=False, threads=budget)
    module = Recorder()
    trainer = pl.Trainer(accelerator="cpu", max_steps=12, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                         limit_val_batches=0)
    trainer.fit(module, datamodule=dm)
    return budget, module.seen


def test_two_cores_and_four_workers_one_thread_each_everywhere(fake_cores):
    fake_cores(2)
    budget, seen = fit_within_budget(2)
    record = budget.to_dict()
    assert (budget.training_threads, budget.worker_threads, budget.loader_workers) == (1, 1, 4)
    assert record["fits"] is False and "the loader workers alone take every core" in record["note"]
    assert record["applied"]["torch_intra_op"] == 1 and record["applied"]["blas"] == 1
    assert {s["trainer_intra"] for s in seen} == {1}
    assert len({pid for s in seen for pid in s["worker_pid"]}) == 4  # four real worker processes reported
    assert {n for s in seen for n in s["worker_intra"]} == {1}
    assert {n for s in seen for n in s["worker_blas"]} == {1}


def test_eight_cores_and_four_workers_train_on_four_threads_workers_on_one(fake_cores):
    fake_cores(8)
    budget, seen = fit_within_budget(8)
    assert budget.training_threads == 4 and budget.to_dict()["fits"]
    assert {s["trainer_intra"] for s in seen} == {4}  # not PyTorch's default, not the fake host's 64
    # forked workers would inherit the trainer's 4 BLAS threads; the budget sets them to 1 as they start
    assert {n for s in seen for n in s["worker_blas"]} == {1}
    assert {n for s in seen for n in s["worker_intra"]} == {1} and {n for s in seen for n in s["worker_inter"]} == {1}


def test_default_sets_nothing_and_changes_no_numerics(fake_cores):
    fake_cores(8)
    T.restore_original()
    torch.set_num_threads(3)  # whatever this process runs with stays
    budget, seen = fit_within_budget(8, "accel.threads=default")
    assert budget.training_threads is None and budget.applied["torch_intra_op"] == 3
    assert {s["trainer_intra"] for s in seen} == {3}
    assert "PyTorch's default" in budget.note() and budget.numerics_changes() == []
    assert T.pool_kwargs() == {}


def test_a_thread_count_other_than_the_default_is_listed_as_a_numerics_change(fake_cores):
    fake_cores(8)
    T.restore_original()
    default = torch.get_num_threads()
    same = T.ThreadBudget.plan(default, 8, "affinity", 1, loader_workers=0, pool_workers=0).apply()
    assert same.numerics_changes() == []
    other = T.ThreadBudget.plan(default + 1, 8, "affinity", 1, loader_workers=0, pool_workers=0).apply()
    assert other.numerics_changes() == [f"threads ({default + 1} intra-op threads instead of PyTorch's {default} "
                                        "here: parallel reductions sum in another order)"]


def test_process_pools_start_within_the_budget(fake_cores):
    from concurrent.futures import ProcessPoolExecutor

    from drivebench.data.preprocess import pool_context

    T.ThreadBudget.plan("auto", 8, "affinity", 1, loader_workers=0, pool_workers=2).apply()
    with ProcessPoolExecutor(2, mp_context=pool_context(), **T.pool_kwargs()) as pool:
        counts = list(pool.map(_pool_threads, range(4)))
    assert {c["torch_intra_op"] for c in counts} == {1} and {c["blas"] for c in counts} == {1}
    T.ThreadBudget.plan("default", 8, "affinity", 1, loader_workers=0, pool_workers=2).apply()
    assert T.pool_kwargs() == {}  # without a budget pools start as Python starts them


def _pool_threads(_: int) -> dict:
    return T.in_effect()
