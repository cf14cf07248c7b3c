"""Which folders the notebooks read (``DRIVEBENCH_RUNS``): relative ones from where Jupyter started."""

from __future__ import annotations

import os
from pathlib import Path

from drivebench.report.discovery import runs_from_env


def test_relative_folders_resolve_from_the_directory_jupyter_started_in(tmp_path):
    started = tmp_path / "repo"
    started.mkdir()
    env = {"PWD": str(started), "DRIVEBENCH_RUNS": os.pathsep.join(["outputs/multirun/a", str(tmp_path / "abs"), ""])}
    assert runs_from_env(Path("/default"), env) == [started / "outputs/multirun/a", tmp_path / "abs"]


def test_unset_means_the_default_and_a_stale_pwd_falls_back_to_the_working_directory(tmp_path, monkeypatch):
    assert runs_from_env(tmp_path / "outputs", {}) == [tmp_path / "outputs"]
    monkeypatch.chdir(tmp_path)
    assert runs_from_env(Path("/x"), {"PWD": str(tmp_path / "gone"), "DRIVEBENCH_RUNS": "runs"}) == [tmp_path / "runs"]
