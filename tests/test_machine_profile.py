"""A GPU machine profile on a machine without a GPU: the run goes on on the CPU, and says so."""

import logging
from pathlib import Path

import torch
import pytest
from hydra import compose, initialize_config_dir

from drivebench.app import build_run

CONF = str(Path(__file__).resolve().parents[1] / "drivebench" / "conf")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU case")
def test_gpu_profile_on_a_cpu_machine_warns_and_runs_on_the_cpu(tmp_path, caplog, monkeypatch):
    monkeypatch.setenv("DRIVEBENCH_CACHE", str(tmp_path / "cache"))
    with initialize_config_dir(config_dir=CONF, version_base=None):
        cfg = compose("config", overrides=["machine=h200", "model=maptr", "model.size=test", "data.size=mini"])
    with caplog.at_level(logging.WARNING, logger="drivebench"):
        run = build_run(cfg, tmp_path / "run", progress=False)
    assert run.machine.accelerator == "cpu"
    assert any("machine=h200 describes a GPU machine" in r.getMessage() for r in caplog.records)


def test_the_local_profile_does_not_warn(tmp_path, caplog, monkeypatch):
    monkeypatch.setenv("DRIVEBENCH_CACHE", str(tmp_path / "cache"))
    with initialize_config_dir(config_dir=CONF, version_base=None):
        cfg = compose("config", overrides=["model=maptr", "model.size=test", "data.size=mini"])
    with caplog.at_level(logging.WARNING, logger="drivebench"):
        build_run(cfg, tmp_path / "run", progress=False)
    assert not any("describes a GPU machine" in r.getMessage() for r in caplog.records)
