"""drivebench.report on hand-written summaries: grouping, speedup, labels, argument forms, bad input.

No training here (tests/test_report_smoke.py reports a real sweep): each run folder gets a small
``summary.json`` with only the keys a case needs, which is also what an older or newer schema looks
like to the reader.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from drivebench.report import analysed, load_runs, parse_target
from drivebench.report.analysis import knob_changes, time_to_target
from drivebench.report.cli import main, parse_args
from drivebench.report.labels import setting_overrides, machine_label, setting_label

H200 = {"hostname": "node-7", "cpu_model": "Xeon", "cpu_cores": 16, "accelerator": "cuda",
        "gpus": [{"index": 0, "name": "NVIDIA H200", "memory_gb": 139.8, "capability": "9.0"}]}
A100 = {"hostname": "node-2", "cpu_model": "EPYC", "cpu_cores": 8, "accelerator": "cuda",
        "gpus": [{"index": 0, "name": "NVIDIA A100-SXM4-80GB", "memory_gb": 79.2, "capability": "8.0"}]}
CPU = {"hostname": "laptop", "cpu_model": "AMD EPYC", "cpu_cores": 2, "accelerator": "cpu", "gpus": []}


def write_run(folder: Path, *, machine: dict, profile: str = "local", model: str = "qcnet", accel: str = "none",
              throughput: float = 10.0, overrides: list[str] | None = None, status: str = "completed",
              schema_version: int = 1, started: str = "2026-01-01T00:00:00", job_num: int | None = None,
              knobs: dict | None = None) -> Path:
    """A run folder as a finished run leaves it (summary.json plus the .hydra files the report reads)."""
    folder.mkdir(parents=True)
    summary = {
        "schema_version": schema_version,
        "run": {"model": model, "model_size": "tiny", "data": "argoverse2", "accel": accel, "bench": "train",
                "dist": "single", "machine_profile": profile, "status": status, "started": started,
                "command": "python -m drivebench " + " ".join(overrides or [])},
        "machine": machine,
        "settings": {"accel": {"name": accel, "num_workers": 0, **(knobs or {})}},
        "train": {"steps_measured": 30, "warmup_steps": 10, "samples_per_s": throughput,
                  "samples_per_s_per_step": {"median": throughput, "p10": throughput * 0.9,
                                             "p90": throughput * 1.1},
                  "data_wait_fraction": 0.25},
        "efficiency": 0.5,
        "loss": {"first": 40.0, "final": 30.0},
        "val": {"minFDE": 3.0},
    }
    (folder / "summary.json").write_text(json.dumps(summary))
    hydra = folder / ".hydra"
    hydra.mkdir()
    (hydra / "config.yaml").write_text(f"model:\n  name: {model}\naccel:\n  name: {accel}\n")
    (hydra / "overrides.yaml").write_text("".join(f"- {o}\n" for o in (overrides or [])))
    if job_num is not None:
        (hydra / "hydra.yaml").write_text(f"hydra:\n  job:\n    num: {job_num}\n")
    return folder


def test_groups_by_recorded_machine_not_by_folder(tmp_path):
    # copied side by side, in folders named the wrong way round: the summaries decide
    write_run(tmp_path / "a100" / "run1", machine=H200, profile="h200", accel="none", throughput=10.0)
    write_run(tmp_path / "a100" / "run2", machine=H200, profile="h200", accel="max", throughput=25.0)
    write_run(tmp_path / "h200" / "run1", machine=A100, profile="a100", accel="none", throughput=4.0)
    write_run(tmp_path / "h200" / "run2", machine=A100, profile="a100", accel="max", throughput=6.0)
    _, runs = analysed([tmp_path / "a100", tmp_path / "h200"], [])
    assert set(runs["machine"]) == {"1x NVIDIA H200 @ h200", "1x NVIDIA A100-SXM4-80GB @ a100"}
    speedup = {(r.machine.split(" @ ")[1], r.setting): r.speedup for r in runs.itertuples()}
    assert speedup == pytest.approx({("h200", "none"): 1.0, ("h200", "max"): 2.5,
                                     ("a100", "none"): 1.0, ("a100", "max"): 1.5})


def test_speedup_needs_a_baseline_of_the_same_model_and_machine(tmp_path):
    write_run(tmp_path / "r1", machine=CPU, model="qcnet", accel="none", throughput=2.0)
    write_run(tmp_path / "r2", machine=CPU, model="maptr", accel="max", throughput=8.0)
    _, runs = analysed([tmp_path], [])
    by_model = runs.set_index("model")["speedup"]
    assert by_model["qcnet"] == pytest.approx(1.0)
    assert math.isnan(by_model["maptr"])  # no maptr baseline: no invented speedup


def test_local_machines_stay_apart_by_hostname():
    assert machine_label(CPU, "local") == "CPU (AMD EPYC, 2 cores) @ laptop"
    other = {**CPU, "hostname": "desktop"}
    assert machine_label(other, "local") != machine_label(CPU, "local")
    two = {**H200, "gpus": H200["gpus"] * 2}
    assert machine_label(two, "h200") == "2x NVIDIA H200 @ h200"


def test_setting_names_the_knobs_a_run_overrode(tmp_path):
    assert setting_overrides(["accel=none", "accel.num_workers=4", "++accel.pin_memory=true", "model=qcnet",
                            "accel.x.y=1"]) == {"num_workers": "4", "pin_memory": "true"}
    # a model's own speed knobs too (model.net.*), named apart from accel's; deeper or other model keys are not knobs
    assert setting_overrides(["model.net.aggregation=compiled", "+model.net.compile_scope=encoder",
                              "model.net.a.b=1", "model.optimizer.lr=1e-3"]) == {
        "net.aggregation": "compiled", "net.compile_scope": "encoder"}
    assert setting_label("max", {"net.aggregation": "compiled"}) == "max net.aggregation=compiled"
    assert setting_label("none", {"num_workers": "4"}) == "none num_workers=4"
    write_run(tmp_path / "r1", machine=CPU, accel="none", overrides=["accel=none", "accel.num_workers=4"])
    write_run(tmp_path / "r2", machine=CPU, accel="none", overrides=["accel=none"])
    write_run(tmp_path / "r3", machine=CPU, accel="none", overrides=["accel=none", "model.net.aggregation=compiled"])
    _, runs = analysed([tmp_path], [])
    assert sorted(runs["setting"]) == ["none", "none net.aggregation=compiled", "none num_workers=4"]
    # the override is a different setting, not a baseline repeat
    assert runs.set_index("setting").loc["none num_workers=4", "speedup"] == pytest.approx(1.0)


def test_repeats_are_labelled_and_settings_follow_the_sweep_order(tmp_path):
    for num, step in enumerate(["none", "pool", "cpu", "workers"]):
        write_run(tmp_path / f"{num}", machine=CPU, accel=step, job_num=num, throughput=2.0 + num,
                  knobs={"num_workers": 1 if step == "workers" else 0})
    write_run(tmp_path / "9", machine=CPU, accel="pool", job_num=9, throughput=2.5)
    _, runs = analysed([tmp_path], [])
    assert runs["setting_key"].tolist() == ["none", "pool", "pool #2", "cpu", "workers"]
    changes = knob_changes(runs).tolist()
    assert changes[0] == "" and changes[-1] == "num_workers=1"
    assert changes[1] == "(nothing changed on this machine)"


def test_same_setting_under_two_benches_plots_in_separate_panels(tmp_path):
    from drivebench.report.plots import throughput_figure

    write_run(tmp_path / "train", machine=CPU, accel="max", throughput=5.0)
    loader = write_run(tmp_path / "loader", machine=CPU, accel="max", throughput=50.0)
    summary = json.loads((loader / "summary.json").read_text())
    summary["run"]["bench"] = "loader"
    (loader / "summary.json").write_text(json.dumps(summary))
    _, runs = analysed([tmp_path], [])
    assert runs["setting_key"].tolist() == ["max", "max"]  # one per group: no repeat label
    fig = throughput_figure(runs)  # raised "cannot reindex on an axis with duplicate labels" before
    titles = sorted(ax.get_title() for ax in fig.axes if ax.get_visible())
    assert len(titles) == 2 and any("bench loader" in t for t in titles)


def test_ceiling_only_runs_report_the_ceiling_throughput(tmp_path):
    run = write_run(tmp_path / "ceiling", machine=CPU)
    summary = json.loads((run / "summary.json").read_text())
    summary["ceiling"] = summary.pop("train")
    summary["ceiling"]["samples_per_s_per_step"]["median"] = 7.0
    (run / "summary.json").write_text(json.dumps(summary))
    row = load_runs([tmp_path]).runs.iloc[0]
    assert row["throughput_phase"] == "ceiling" and row["throughput_median"] == 7.0


def test_target_forms():
    target = parse_target("val/minFDE<=2.0")
    assert (target.metric, target.op, target.value) == ("val/minFDE", "<=", 2.0)
    assert parse_target("mAP >= 0.5").met(0.5) and not parse_target("mAP>0.5").met(0.5)
    with pytest.raises(ValueError, match="METRIC<=VALUE"):
        parse_target("val/minFDE=2")


def test_time_to_target_takes_the_first_crossing_and_skips_the_ceiling():
    scalars = pd.DataFrame({
        "phase": ["train", "train", "train", "ceiling"],
        "tag": ["train/loss"] * 4,
        "step": [0, 10, 20, 0],
        "value": [50.0, 29.0, 20.0, 1.0],
        "wall_time": [1.0, 2.0, 3.0, 9.0],
        "elapsed_s": [1.0, 2.0, 3.0, 9.0],
    })
    assert time_to_target(scalars, parse_target("loss<=30")) == {"state": "reached", "step": 10.0, "elapsed_s": 2.0}
    assert time_to_target(scalars, parse_target("train/loss<=5"))["state"] == "not reached"
    assert time_to_target(scalars, parse_target("val/mAP>=0.5"))["state"] == "no series"


def test_hydra_style_arguments():
    args = parse_args(["outputs/x", "report.target=val/minFDE<=2.0", "report.out=/tmp/r",
                       "report.target=[train/loss<=3,val/MR<=0.2]"])
    assert args.dirs == [Path("outputs/x")] and args.out == Path("/tmp/r")
    assert args.target == ["val/minFDE<=2.0", "train/loss<=3", "val/MR<=0.2"]
    # the older flags mean the same, mixed in any order
    flags = parse_args(["--target", "val/minFDE<=2.0", "outputs/x", "--out=/tmp/r", "--target=train/loss<=3",
                        "report.target=val/MR<=0.2"])
    assert flags == parse_args(["outputs/x", "report.target=[val/minFDE<=2.0,train/loss<=3,val/MR<=0.2]",
                                "report.out=/tmp/r"])


@pytest.mark.parametrize("argv, words", [
    (["outputs/x", "report.outt=/tmp/r"], "report.outt=/tmp/r is not a key of report; valid keys: dirs, out, target"),
    (["outputs/x", "--outt", "/tmp/r"], "--outt is not an option of drivebench report"),
    (["report.out=/tmp/r"], "give at least one folder of runs"),
])
def test_bad_options_are_one_line_naming_them(argv, words, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"drivebench.report: error: {words}") and len(err.strip().splitlines()) == 1, err


def test_bad_inputs_exit_2_with_one_line(tmp_path, capsys):
    empty = tmp_path / "empty"
    (empty / "sub").mkdir(parents=True)
    assert main([str(empty)]) == 2
    assert "no drivebench runs under" in capsys.readouterr().err
    assert main([str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    write_run(tmp_path / "ok" / "r1", machine=CPU)
    assert main([str(tmp_path / "ok"), "--target", "loss=3"]) == 2
    assert "METRIC<=VALUE" in capsys.readouterr().err
    (tmp_path / "a-file").write_text("")  # an out folder that cannot be made: named with its key, before any run is read
    assert main([str(tmp_path / "ok"), f"report.out={tmp_path / 'a-file' / 'r'}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"drivebench.report: error: report.out={tmp_path / 'a-file' / 'r'}: cannot create") and \
        len(err.strip().splitlines()) == 1, err


def test_mixed_schema_and_broken_runs_are_reported_not_raised(tmp_path, capsys):
    good = write_run(tmp_path / "good", machine=CPU, throughput=3.0)
    (good / "tb").mkdir()
    (good / "tb" / "events.out.tfevents.1.host.1.0").write_bytes(b"not an event file")
    write_run(tmp_path / "newer", machine=CPU, accel="max", throughput=6.0, schema_version=2)
    write_run(tmp_path / "failed", machine=CPU, status="failed")
    (write_run(tmp_path / "garbled", machine=CPU) / "summary.json").write_text("{not json")
    crashed = write_run(tmp_path / "crashed", machine=CPU, model="maptr")
    (crashed / "summary.json").unlink()
    (crashed / "__main__.log").write_text("[INFO] start\n[ERROR] RuntimeError: CUDA out of memory\n")

    runset = load_runs([tmp_path])
    assert sorted(runset.runs["run"]) == ["good", "newer"]
    kinds = {Path(p.run_dir).name: (p.kind, p.reason) for p in runset.problems}
    assert kinds["failed"][0] == "crashed" and "'failed'" in kinds["failed"][1]
    assert kinds["garbled"][0] == "unreadable" and "summary.json" in kinds["garbled"][1]
    assert kinds["crashed"][0] == "crashed" and "CUDA out of memory" in kinds["crashed"][1]
    assert any("schema_version 2" in w for w in runset.warnings)
    assert any("events.out.tfevents.1.host.1.0" in w and "not readable" in w for w in runset.warnings)

    out = tmp_path / "report"
    assert main([str(tmp_path), "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
    md = (out / "report.md").read_text()
    for name in ("failed", "garbled", "crashed"):
        assert str(tmp_path / name) in md
    assert "schema_version 2" in md
    assert len(pd.read_csv(out / "report.csv")) == 2


def test_only_crashed_runs_still_lists_them_and_exits_2(tmp_path, capsys):
    crashed = write_run(tmp_path / "crashed", machine=CPU)
    (crashed / "summary.json").unlink()
    assert main([str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert "no completed run" in captured.err and "Traceback" not in captured.err
    assert str(crashed) in (tmp_path / "report.md").read_text()


@pytest.mark.parametrize("path", sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb")),
                         ids=lambda p: p.stem)
def test_notebooks_are_committed_without_outputs(path):
    import nbformat

    notebook = nbformat.read(path, as_version=4)
    nbformat.validate(notebook)
    code = [c for c in notebook.cells if c.cell_type == "code"]
    assert code, f"{path.name} has no code"
    assert all(not c.outputs and c.execution_count is None for c in code), (
        f"{path.name} holds outputs: clear them (jupyter nbconvert --clear-output --inplace {path.name})")
    assert any("DRIVEBENCH_RUNS" in c.source for c in code)


def test_bottleneck_and_an_efficiency_above_100_percent_show_with_their_reasons(tmp_path):
    from drivebench.report.tables import bottleneck_table, main_table

    folder = write_run(tmp_path / "run1", machine=CPU, accel="max")
    summary = json.loads((folder / "summary.json").read_text())
    summary["efficiency"] = 1.22
    summary["efficiency_note"] = "above 100%: the machine was oversubscribed during the ceiling (9 runnable tasks)"
    summary["bottleneck"] = {"verdict": "CPU oversubscription", "evidence": "9 runnable tasks on 2 cores",
                             "next": "accel.threads=auto"}
    (folder / "summary.json").write_text(json.dumps(summary))
    # an older summary, written before verdicts: it gets one from its own figures (25% data wait)
    old = write_run(tmp_path / "run2", machine=CPU, accel="none")
    summary = json.loads((old / "summary.json").read_text())
    summary["train"]["wall_s"] = 30.0
    summary["efficiency"] = 1.05  # and an efficiency above 100% without a recorded reason
    summary["ceiling"] = {"steps_measured": 4, "step_s": {"median": 1.0, "p10": 0.9, "p90": 1.1}}
    (old / "summary.json").write_text(json.dumps(summary))
    _, runs = analysed([tmp_path], [])
    table = main_table(runs, [])
    cells = dict(zip(runs["accel"], table["efficiency vs ceiling"]))
    assert cells["max"] == "122% (above 100%: the machine was oversubscribed during the ceiling (9 runnable tasks))"
    assert cells["none"] == "105% (above 100%: the ceiling measured only 4 steps)"
    assert list(table["bottleneck"]) == ["data loading", "CPU oversubscription"]  # none first, in sweep order
    verdicts = bottleneck_table(runs)
    assert verdicts.to_dict("records")[1]["next"] == "accel.threads=auto" and len(verdicts) == 2


def test_a_run_that_shared_its_gpu_is_named_in_a_warning(tmp_path):
    gpu = {"hostname": "h200", "accelerator": "cuda", "gpus": [{"name": "NVIDIA H200"}], "cpu_cores": 16}
    for name, used in (("alone", 21.9), ("beside", 48.4)):
        folder = write_run(tmp_path / name, machine=gpu, accel="none" if name == "alone" else "max")
        summary = json.loads((folder / "summary.json").read_text())
        summary["train"]["system"] = {"gpu_mem_gb": {"median": used}}
        summary["memory"] = {"peak_device_reserved_gb": 21.5}
        (folder / "summary.json").write_text(json.dumps(summary))
    runset = load_runs([tmp_path])
    shared = [w for w in runset.warnings if "another process shared the GPU" in w]
    assert len(shared) == 1 and "beside" in shared[0] and "26.9 GiB" in shared[0]
    assert sorted(runset.runs["gpu_others_gb"].round(1)) == [0.4, 26.9]
    # a machine of its own: the shared run is compared only with runs that shared theirs (here none: no speedup)
    machines = dict(zip(runset.runs["accel"], runset.runs["machine"]))
    assert machines == {"none": "1x NVIDIA H200 @ h200", "max": "1x NVIDIA H200 @ h200, GPU shared"}
    _, runs = analysed([tmp_path], [])
    assert math.isnan(runs.set_index("accel").loc["max", "speedup"])


def test_a_run_that_decoded_on_the_gpu_before_the_decode_stream_is_named_in_a_warning(tmp_path):
    """A summary listing the device decode on a GPU without ``settings.device_decode`` was written before the
    decode took a stream of its own: the report says its numbers are not evidence; a CPU run or a newer run is not named."""
    gpu = {"hostname": "h100", "accelerator": "cuda", "gpus": [{"name": "NVIDIA H100"}], "cpu_cores": 16}
    decode = "device_transform=decode (nvjpeg decode and bilinear warps differ from the CPU path in the last bits)"
    for name, machine, guarded in (("before", gpu, False), ("after", gpu, True), ("cpu", CPU, False)):
        folder = write_run(tmp_path / name, machine=machine, model="maptr", accel="max")
        summary = json.loads((folder / "summary.json").read_text())
        summary["settings"]["numerics_changed_by"] = ["compile", decode]
        if guarded:
            summary["settings"]["device_decode"] = {"outputs": "a decode stream of their own (since 2026-12-06)"}
        (folder / "summary.json").write_text(json.dumps(summary))
    runset = load_runs([tmp_path])
    named = [w for w in runset.warnings if "decoded its JPEGs on the GPU" in w]
    assert len(named) == 1 and named[0].startswith(str(tmp_path / "before"))
    flags = dict(zip(runset.runs["run_dir"].map(lambda p: Path(p).name), runset.runs["gpu_decode_unguarded"]))
    assert flags == {"before": True, "after": False, "cpu": False}
