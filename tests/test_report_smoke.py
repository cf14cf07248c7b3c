"""End to end on the CPU: the ``smoke`` experiment as a real multirun, then the report and the notebooks
on its output. Numbers in the report are checked against each run's own summary.json and, for the
time-to-target columns, against the TensorBoard events read independently with tbparse.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import matplotlib.image
import nbformat
import pandas as pd
import pytest
from nbclient import NotebookClient
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
EXPECTED_PLOTS = {"throughput", "data_wait", "efficiency", "step_breakdown", "loss_vs_step", "loss_vs_time",
                  "time_to_target"}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    """``python -m drivebench -m +experiment=smoke`` started outside the repo, into a temporary sweep dir."""
    root = tmp_path_factory.mktemp("smoke")
    sweep_dir = root / "sweep"
    env = {**os.environ, "PYTHONPATH": str(REPO), "DRIVEBENCH_CACHE": str(root / "cache")}
    result = subprocess.run([sys.executable, "-m", "drivebench", "-m", "+experiment=smoke",
                             f"hydra.sweep.dir={sweep_dir}"], cwd=root, env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return sweep_dir


@pytest.fixture(scope="module")
def summaries(sweep) -> dict[str, dict]:
    found = {p.parent.name: json.loads(p.read_text()) for p in sweep.glob("*/summary.json")}
    assert len(found) == 2, f"the smoke sweep should leave two runs, found {sorted(found)}"
    return found


def _train_loss(run_dir: Path) -> pd.DataFrame:
    """train/loss of the training phase, read with tbparse: ``fit/train/loss`` of the run's one event
    stream (the ceiling's losses are ``ceiling/train/loss`` there)."""
    from tbparse import SummaryReader

    frames = []
    for event_file in sorted((run_dir / "tb").glob("events.out.tfevents.*")):
        data = SummaryReader(str(event_file)).scalars
        frames.append(data[data["tag"] == "fit/train/loss"])
    return pd.concat(frames).sort_values("step")


@pytest.fixture(scope="module")
def report(sweep, summaries, tmp_path_factory):
    """The CLI in a subprocess, with Hydra-style and flag-style arguments mixed."""
    none_run = next(name for name, s in summaries.items() if s["run"]["accel"] == "none")
    loss = _train_loss(sweep / none_run)
    threshold = float(loss["value"].median())
    expected_step = int(loss[loss["value"] <= threshold]["step"].iloc[0])
    targets = [f"train/loss<={threshold!r}", "val/loss<=1e12", "train/loss<=-1", "val/no_such_metric>=0"]
    out = tmp_path_factory.mktemp("report")
    argv = [sys.executable, "-m", "drivebench.report", str(sweep), f"report.out={out}",
            f"report.target={targets[0]}", *[f"--target={t}" for t in targets[1:]]]
    result = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return {"out": out, "stdout": result.stdout, "stderr": result.stderr, "targets": targets,
            "none_run": none_run, "expected_step": expected_step}


def test_one_row_per_run_with_the_summary_numbers(report, summaries):
    table = pd.read_csv(report["out"] / "report.csv").set_index("run")
    assert sorted(table.index) == sorted(summaries)
    for name, summary in summaries.items():
        row, train = table.loc[name], summary["train"]
        assert row["setting"] == summary["run"]["accel"]
        assert row["model"] == summary["run"]["model"] and row["model_size"] == summary["run"]["model_size"]
        assert summary["machine"]["cpu_model"] in row["machine"]
        assert row["machine"].endswith(f"@ {summary['machine']['hostname']}")
        assert row["throughput_median"] == pytest.approx(train["samples_per_s_per_step"]["median"])
        assert row["throughput_p10"] == pytest.approx(train["samples_per_s_per_step"]["p10"])
        assert row["throughput_p90"] == pytest.approx(train["samples_per_s_per_step"]["p90"])
        assert row["data_wait_fraction"] == pytest.approx(train["data_wait_fraction"])
        assert row["efficiency"] == pytest.approx(summary["efficiency"])
        assert row["ceiling_samples_per_s"] == pytest.approx(summary["ceiling"]["samples_per_s"])
        assert row["loss_first"] == pytest.approx(summary["loss"]["first"])
        assert row["loss_final"] == pytest.approx(summary["loss"]["final"])
        for key, value in summary["val"].items():
            assert row[f"val/{key}"] == pytest.approx(value)
        assert row["accel.num_workers"] == summary["settings"]["accel"]["num_workers"]
    base = table[table["setting"] == "none"].iloc[0]
    fast = table[table["setting"] == "max"].iloc[0]
    assert base["speedup"] == pytest.approx(1.0)
    assert fast["speedup"] == pytest.approx(fast["throughput_median"] / base["throughput_median"])


def test_time_to_target_follows_the_tensorboard_series(report, summaries):
    table = pd.read_csv(report["out"] / "report.csv").set_index("run")
    median_target, val_target, unreachable, missing = report["targets"]
    row = table.loc[report["none_run"]]
    assert row[f"to {median_target} state"] == "reached"
    assert row[f"to {median_target} steps"] == report["expected_step"]
    assert 0 < row[f"to {median_target} wall_s"] < summaries[report["none_run"]]["run"]["wall_s"]
    # the end-of-run validation counts at the last training step, not at its own trainer's step 0
    assert row[f"to {val_target} steps"] == summaries[report["none_run"]]["train"]["steps_total"]
    assert (table[f"to {unreachable} state"] == "not reached").all()
    assert (table[f"to {missing} state"] == "no series").all()
    assert not [c for c in table.columns if c.startswith("val/") and ("<=" in c or ">=" in c)]


def test_markdown_terminal_and_plots(report, summaries):
    md = (report["out"] / "report.md").read_text()
    for name, summary in summaries.items():
        assert name in md and f"{summary['train']['samples_per_s_per_step']['median']:.3g}" in md
        assert name in report["stdout"]
    assert "samples/s median [p10-p90]" in report["stdout"]
    assert "did not complete" not in md and "Traceback" not in report["stderr"]
    pngs = {p.stem: p for p in report["out"].glob("*.png")}
    assert set(pngs) == EXPECTED_PLOTS
    for path in pngs.values():
        assert path.read_bytes()[:8] == PNG_SIGNATURE
        with Image.open(path) as image:
            image.verify()
        pixels = matplotlib.image.imread(path)
        assert pixels.shape[0] > 250 and pixels.shape[1] > 250  # a figure, not an empty canvas
        assert f"({path.name})" in md


def test_a_crashed_job_is_listed_and_the_rest_reported(sweep, summaries, tmp_path, capsys):
    from drivebench.report.cli import main

    copy = tmp_path / "runs"
    shutil.copytree(sweep, copy)
    crashed = next(p for p in copy.iterdir() if p.is_dir())
    (crashed / "summary.json").unlink()
    assert main([str(copy), "--out", str(tmp_path / "out")]) == 0
    captured = capsys.readouterr()
    assert str(crashed) in captured.out and "Traceback" not in captured.out + captured.err
    assert len(pd.read_csv(tmp_path / "out" / "report.csv")) == 1
    assert str(crashed) in (tmp_path / "out" / "report.md").read_text()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_headless_on_the_sweep(path, sweep, summaries, monkeypatch):
    # as `DRIVEBENCH_RUNS=sweep jupyter lab notebooks/` typed in the sweep's parent: a relative folder is
    # taken from where Jupyter started ($PWD), while the kernel runs in notebooks/
    monkeypatch.setenv("PWD", str(sweep.parent))
    monkeypatch.setenv("DRIVEBENCH_RUNS", sweep.name)
    monkeypatch.setenv("DRIVEBENCH_TARGETS", "train/loss<=1e12")
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(notebook, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()  # raises on a failing cell
    text = "".join(o.get("text", "") for c in notebook.cells if c.cell_type == "code" for o in c.outputs)
    assert f"{len(summaries)} completed run(s), 0 not usable" in text
    images = sum("image/png" in o.get("data", {}) for c in notebook.cells if c.cell_type == "code"
                 for o in c.outputs)
    assert images >= 4
