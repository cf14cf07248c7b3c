"""The doctor's memory.threads check: what PyTorch's default threads do on this machine (a cgroup
quota below the host's CPUs, another busy process), and the run's thread budget."""

from __future__ import annotations

import pytest

from drivebench.doctor import memory
from drivebench.doctor.context import build_context
from drivebench.doctor.result import Status
from drivebench.perf import machine as M
from drivebench.perf import system


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path):
    monkeypatch.setenv("DRIVEBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)


def quota_machine(monkeypatch, default_intra: int, runnable: int) -> None:
    """Two cores by a cgroup quota on a 64-CPU host whose PyTorch defaults to ``default_intra`` threads."""
    source = "cgroup /sys/fs/cgroup/cpu.max 200000 100000 (2 CPUs, below the affinity of 64)"
    monkeypatch.setattr(M, "usable_cores", lambda: M.CoreCount(2, source, 64, 64, 2.0))
    monkeypatch.setattr(memory, "default_threads", lambda: {"torch_intra_op": default_intra, "torch_inter_op": 32,
                                                            "blas": default_intra, "openmp": default_intra})
    monkeypatch.setattr(system, "read_run_queue", lambda: (runnable, float(runnable)))


def check(*overrides: str):
    return memory.threads(build_context(list(overrides), skip_slow=True))


def test_defaults_that_count_the_hosts_cpus_warn_with_the_budget_as_remedy(monkeypatch):
    quota_machine(monkeypatch, default_intra=64, runnable=1)
    result = check("accel=none")
    assert result.status is Status.WARN
    assert "64 intra-op threads exceed the 2 usable cores" in result.saw and "cpu.max 200000 100000" in result.saw
    assert result.remedy.startswith("accel.threads=auto (2 training threads")
    assert result.data["budget"]["knob"] == "default"
    budgeted = check()  # the default run: accel=max, accel.threads=auto
    assert budgeted.status is Status.PASS
    assert "PyTorch's defaults here: 64 intra-op threads" in budgeted.saw and "65 threads on 2 cores" in budgeted.saw
    assert "1 training thread (accel.threads=auto) + 1 loader worker x 1 on 2 usable cores: fits" in budgeted.saw


def test_a_busy_machine_warns_that_default_threads_stall(monkeypatch):
    quota_machine(monkeypatch, default_intra=2, runnable=3)
    result = check("accel=none")
    assert result.status is Status.WARN and "3 runnable tasks on the machine now" in result.saw
    assert "wait at every op's barrier" in result.saw and result.remedy.startswith("accel.threads=1 ")
    # the budgeted run trains on one thread beside its worker: nothing waits at a barrier
    assert check().status is Status.PASS
    assert check("accel.threads=2").status is Status.WARN


def test_an_idle_machine_with_fitting_defaults_passes(monkeypatch):
    quota_machine(monkeypatch, default_intra=2, runnable=0)
    assert check("accel=none").status is Status.PASS
