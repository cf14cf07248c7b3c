"""``drivebench report`` over a mixed set: real tiny runs of two models and two benches (training
without validation or ceiling, the ceiling alone, the data pipeline alone), a storage bench, and
hand-damaged copies of them (summary sections of another shape, another schema version, a missing
model size, a failed status, no summary at all, garbage JSON, a truncated TensorBoard file). The
report writes what it can and says what it skipped and why; nothing raises."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from conftest import run_cli

from drivebench.report.cli import main

BOUNDED = ["bench.warmup_steps=1", "bench.steps=2", "bench.val_batches=0", "bench.ceiling=false",
           "bench.ceiling_warmup_steps=1", "bench.ceiling_steps=2", "bench.loader_batches=2", "ckpt=none"]


@pytest.fixture(scope="module")
def real_runs(tmp_path_factory, drivebench_cache) -> Path:
    """One multirun (one process): qcnet and maptr x train (no validation, no ceiling), ceiling, loader."""
    root = tmp_path_factory.mktemp("mixed")
    result = run_cli(["-m", "model=qcnet,maptr", "bench=train,ceiling,loader", "accel=none", *BOUNDED,
                      f"hydra.sweep.dir={root / 'sweep'}"], drivebench_cache, cwd=root)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    storage = run_cli(["bench=storage", f"ckpt.dir={root / 'a'},{root / 'b'}", "bench.size_mb=1", "bench.repeats=1",
                       f"hydra.run.dir={root / 'sweep' / 'storage'}"], drivebench_cache, cwd=root)
    assert storage.returncode == 0, storage.stdout[-3000:] + storage.stderr[-3000:]
    return root / "sweep"


def _copy(src: Path, dst: Path, edit=None) -> Path:
    shutil.copytree(src, dst)
    if edit is not None:
        summary = json.loads((dst / "summary.json").read_text())
        edit(summary)
        (dst / "summary.json").write_text(json.dumps(summary))
    return dst


def _train_run(sweep: Path, model: str) -> Path:
    found = [p.parent for p in sweep.glob("*/summary.json")
             if json.loads(p.read_text())["run"].get("model") == model
             and json.loads(p.read_text())["run"].get("bench") == "train"]
    assert len(found) == 1, found
    return found[0]


def test_a_mixed_set_reports_what_it_can_and_names_what_it_skipped(real_runs, tmp_path, capsys) -> None:
    runs = tmp_path / "runs"
    shutil.copytree(real_runs, runs)
    qcnet = _train_run(runs, "qcnet")

    def other_shape(s):  # a newer writer's layout: sections that are not mappings
        s.update(schema_version=99, train="see train.json", settings=["accel"])

    def older(s):  # an older schema without the ceiling, the efficiency or the verdict
        s["schema_version"] = 0
        for key in ("ceiling", "efficiency", "efficiency_note", "bottleneck"):
            s.pop(key, None)

    _copy(qcnet, runs / "other_shape", other_shape)
    _copy(qcnet, runs / "older", older)
    _copy(qcnet, runs / "no_size", lambda s: s["run"].pop("model_size"))  # the panel key was NaN: a crash
    _copy(qcnet, runs / "failed", lambda s: s["run"].update(status="failed"))
    _copy(qcnet, runs / "interrupted", lambda s: s["run"].update(  # what drivebench.signals writes on SIGTERM
        status="interrupted", interrupted={"signal": "SIGTERM", "exit_code": 143, "step": 7, "checkpoint": None},
        schedule_steps=20))  # stopped at step 7 of 20
    _copy(qcnet, runs / "stopped_at_its_end", lambda s: s["run"].update(  # a cap in the end-of-run validation
        status="interrupted", interrupted={"signal": "SIGTERM", "exit_code": 143, "step": 20, "checkpoint": None},
        schedule_steps=20))
    (_copy(qcnet, runs / "garbled") / "summary.json").write_text('{"run": {"status": "comp')
    (_copy(qcnet, runs / "crashed") / "summary.json").unlink()
    truncated = _copy(qcnet, runs / "truncated_tb")
    event = next((truncated / "tb").glob("events.out.tfevents.*"))
    event.write_bytes(event.read_bytes()[:40])
    (runs / "empty").mkdir()  # not a run: no summary, no .hydra

    out = tmp_path / "report"
    assert main([str(runs), f"report.out={out}"]) == 0
    captured = capsys.readouterr()
    text = captured.out + captured.err
    assert "Traceback" not in text

    table = pd.read_csv(out / "report.csv")
    names = set(table["run"].map(lambda r: Path(r).parts[0]))
    assert sorted(names) == sorted(["older", "no_size", "truncated_tb", "other_shape", "storage",
                                    *(p.name for p in real_runs.glob("?_*"))])
    assert set(table["model"]) == {"qcnet", "maptr"} and {"train", "ceiling", "loader", "storage"} <= set(table["bench"])
    assert table.loc[table["run"] == "older", "efficiency"].isna().all()
    assert table.loc[table["run"] == "other_shape", "throughput_median"].isna().all()  # its train section is text
    md = (out / "report.md").read_text()
    for name, why in (("failed", "'failed'"), ("garbled", "not readable JSON"),
                      ("crashed", "no summary.json"), ("interrupted", "stopped by SIGTERM at step 7 before its schedule ended"),
                      ("stopped_at_its_end", "at step 20 at the last step of its schedule")):
        line = next((ln for ln in md.splitlines() if str(runs / name) in ln), "")
        assert why in line, (name, line)
        assert str(runs / name) in text
    interrupted = next(ln for ln in md.splitlines() if str(runs / "interrupted") in ln)
    assert interrupted.split("|")[1].strip() == "interrupted" and "rerun it" in interrupted  # not called a crash
    assert "schema_version 0" in md and "schema_version 99" in md and str(event) in md and "not readable" in md
    # every figure is either written or named with the reason it is not
    assert (out / "step_breakdown.png").is_file() and (out / "throughput.png").is_file()
    assert not (out / "efficiency.png").exists()
    assert "efficiency.png not written: no run measured both training and the ceiling" in text
    assert "efficiency.png not written" in md
