"""``+experiment=scaling`` on the CPU: the sweep's jobs, its batch rule, a job the machine cannot hold,
and the real sweep with 2 gloo ranks (devices 1, 2 x P2P on, off, MapTR at test size, a few steps)
followed by the report's scaling table and figure, checked against each job's own summary.json.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf

from drivebench.compose import check_command_line, compose, sweep_jobs
from drivebench.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# test size: MapTR `test` on the mini set, 1 warm-up + 3 measured steps, one loader worker less
TINY = ["model=maptr", "model.size=test", "data.size=mini", "bench.warmup_steps=1", "bench.steps=3",
        "accel.num_workers=0", "~logger"]
GLOBAL_BATCH = 4  # 4 samples per optimizer step: 1 device x 4, 2 devices x 2


def test_the_sweep_is_devices_by_p2p_at_max_without_validation_ceiling_or_checkpoints():
    jobs = sweep_jobs(["+experiment=scaling", "model=maptr"])
    pairs = [(next(o for o in j if o.startswith("dist.devices=")), next(o for o in j if o.startswith("dist.p2p=")))
             for j in jobs]
    assert pairs == [(f"dist.devices={d}", f"dist.p2p={p}") for d in (1, 2, 4, 8) for p in ("on", "off")]
    cfg = compose(["+experiment=scaling", "model=maptr", "dist.devices=4", "dist.p2p=off"])
    assert (cfg.dist.name, cfg.dist.devices, cfg.dist.p2p, cfg.accel.name, cfg.ckpt.name) == ("ddp", 4, "off", "max",
                                                                                              "none")
    assert (cfg.bench.warmup_steps, cfg.bench.steps, cfg.bench.val_batches, cfg.bench.ceiling) == (10, 50, 0, False)
    # the test's device list replaces the experiment's
    small = sweep_jobs(["+experiment=scaling", "dist.devices=1,2"])
    assert sorted({o for j in small for o in j if o.startswith("dist.devices=")}) == ["dist.devices=1", "dist.devices=2"]
    assert len(small) == 4


def _batch(*overrides: str) -> tuple[int, dict]:
    from drivebench.app import validate

    cfg = compose(["+experiment=scaling", "model=maptr", *overrides])
    validate(cfg)
    return cfg.model.batch_size, OmegaConf.to_container(cfg.experiment, resolve=True)


def test_per_device_keeps_the_model_batch_and_global_splits_the_global_batch():
    assert _batch("dist.devices=4")[0] == 4  # MapTR's per-device batch, whatever the device count
    batch, node = _batch("dist.devices=4", "experiment.batch=global")  # null: 8 x the per-device batch
    assert (batch, node["global_batch"], node["model_batch"], node["devices"]) == (8, 32, 4, 4)
    assert _batch("dist.devices=8", "experiment.batch=global", "experiment.global_batch=16")[0] == 2
    # SparseDrive's batch comes from its recipe (an interpolation): the rule reads the resolved value
    from drivebench.app import validate

    cfg = compose(["+experiment=scaling", "model=sparsedrive", "dist.devices=2", "experiment.batch=global"])
    recipe_batch = cfg.model.batch_size
    validate(cfg)
    assert cfg.model.batch_size == 8 * recipe_batch // 2


def test_a_global_batch_that_does_not_divide_stops_the_sweep_before_it_starts():
    argv = ["-m", "+experiment=scaling", "experiment.batch=global", "experiment.global_batch=6", "dist.devices=1,2,4"]
    with pytest.raises(ConfigError) as err:
        check_command_line(argv)  # what `drivebench -m ...` runs before Hydra makes any directory
    assert str(err.value).startswith("experiment.global_batch=6 does not divide over dist.devices=4")
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match=r"experiment.batch='whole' is not valid; choose one of: per_device, global"):
        compose(["+experiment=scaling", "experiment.batch=whole"])


def test_more_devices_than_gpus_is_a_skipped_job_with_its_reason(tmp_path):
    """On a machine with one GPU an 8-device job writes a skipped summary; the report lists it."""
    from drivebench.dist import TooFewDevices, resolve_devices
    from drivebench.report.loading import load_runs
    from drivebench.scaling import skips_unavailable_devices, write_skipped

    cfg = compose(["+experiment=scaling", "model=maptr", "dist.devices=8", "dist.p2p=on"])
    with pytest.raises(TooFewDevices) as err:
        resolve_devices(cfg.dist, 1, "gpu")  # the check every run makes against its machine
    assert skips_unavailable_devices(cfg)
    assert not skips_unavailable_devices(compose(["+experiment=scaling", "experiment.unavailable_devices=error"]))
    run_dir = tmp_path / "6_maptr_max_8dev_p2p-on"
    write_skipped(cfg, run_dir, str(err.value).split(";")[0])
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["run"]["status"] == "skipped"
    assert summary["skipped"]["devices"] == 8 and summary["skipped"]["p2p"] == "on"
    assert summary["skipped"]["reason"] == "dist.devices=8 but this machine has 1 GPU(s)"
    runset = load_runs([tmp_path])
    assert runset.runs.empty
    [problem] = runset.problems
    assert (problem.kind, problem.reason, problem.model) == ("skipped", summary["skipped"]["reason"], "maptr")


# ---- the real sweep ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sweep(tmp_path_factory, drivebench_cache) -> Path:
    root = tmp_path_factory.mktemp("scaling")
    sweep_dir = root / "sweep"
    env = {**os.environ, "PYTHONPATH": str(REPO), "DRIVEBENCH_CACHE": str(drivebench_cache), "OMP_NUM_THREADS": "1"}
    env = {k: v for k, v in env.items() if k not in ("LOCAL_RANK", "WORLD_SIZE", "RANK")}
    args = ["-m", "+experiment=scaling", *TINY, "dist.devices=1,2", "experiment.batch=global",
            f"experiment.global_batch={GLOBAL_BATCH}", f"hydra.sweep.dir={sweep_dir}"]
    result = subprocess.run([sys.executable, "-m", "drivebench", *args], cwd=root, env=env, capture_output=True,
                            text=True, timeout=400)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return sweep_dir


@pytest.fixture(scope="module")
def summaries(sweep) -> dict[tuple[int, str], dict]:
    found = {}
    for path in sweep.glob("*/summary.json"):
        s = json.loads(path.read_text())
        found[(s["experiment"]["devices"], s["dist"]["p2p"]["applied"])] = s
    return found


@pytest.mark.slow
def test_every_job_ran_once_with_its_devices_p2p_and_share_of_the_global_batch(sweep, summaries):
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir()) == [
        "0_maptr_max_1dev_p2p-on", "1_maptr_max_1dev_p2p-off", "2_maptr_max_2dev_p2p-on", "3_maptr_max_2dev_p2p-off"]
    assert sorted(summaries) == [(1, "off"), (1, "on"), (2, "off"), (2, "on")]
    for (devices, p2p), s in summaries.items():
        assert s["run"]["status"] == "completed" and s["run"]["accel"] == "max" and s["run"]["dist"] == "ddp"
        assert s["experiment"] == {"name": "scaling", "batch": "global", "global_batch": GLOBAL_BATCH,
                                   "unavailable_devices": "skip", "devices": devices, "model_batch": 4}
        assert s["settings"]["batch_size"] == GLOBAL_BATCH // devices
        assert s["settings"]["global_batch_size"] == GLOBAL_BATCH
        assert s["train"]["steps_measured"] == 3
        assert ("NCCL_P2P_DISABLE" in s["dist"]["p2p"]["env"]) == (p2p == "off")
        if devices == 2:  # rank 1 composed the job itself: the same share of the global batch
            ranks = s["ranks"]["per_rank"]
            assert s["ranks"]["world_size"] == 2 and ranks[0]["samples"] == ranks[1]["samples"] > 0


@pytest.fixture(scope="module")
def report(sweep, tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    # a doctor record from this host in the run set, in doctor.json's format (docs/doctor.md): on a CPU the
    # doctor has no GPU pair to measure, so the pairs are those of a 2-GPU host
    doctor = {"header": {"tool": "drivebench.doctor", "machine": {"hostname": socket.gethostname(), "gpus": []}},
              "checks": [{"check": "gpu.allreduce", "status": "PASS", "data": {"verdict": "on", "pairs": [
                  {"a": 0, "b": 1, "on_ok": True, "on_busbw_gbs": 250.0, "off_ok": True, "off_busbw_gbs": 30.0},
                  {"a": 0, "b": 2, "on_ok": True, "on_busbw_gbs": 270.0, "off_ok": True, "off_busbw_gbs": 20.0},
                  {"a": 1, "b": 2, "on_ok": True, "on_busbw_gbs": 260.0, "off_ok": False, "off_busbw_gbs": None}]}}]}
    (sweep / "doctor.json").write_text(json.dumps(doctor))
    out = tmp_path_factory.mktemp("scaling-report")
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-m", "drivebench.report", str(sweep), f"report.out={out}"],
                            env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return out, result


@pytest.mark.slow
def test_the_report_writes_the_scaling_table_and_figure_for_both_device_counts(report, summaries):
    out, result = report
    table = pd.read_csv(out / "scaling.csv")
    assert sorted(zip(table["p2p"], table["devices"])) == [("off", 1), ("off", 2), ("on", 1), ("on", 2)]

    def throughput(s: dict) -> float:  # rank 0's median per-step throughput x world size
        return s["train"]["samples_per_s_per_step"]["median"] * s["experiment"]["devices"]

    base = pd.Series([throughput(summaries[(1, p)]) for p in ("on", "off")]).median()
    for (devices, p2p), s in summaries.items():
        row = table[(table["devices"] == devices) & (table["p2p"] == p2p)].iloc[0]
        assert row["samples_per_s"] == pytest.approx(throughput(s))
        assert row["efficiency"] == pytest.approx(throughput(s) / (devices * base))
        assert row["batch_per_device"] == GLOBAL_BATCH // devices and row["global_batch"] == GLOBAL_BATCH
        wall = s["ranks"]["global_samples_per_s"] if devices == 2 else s["train"]["samples_per_s"]
        assert row["global_samples_per_s_wall"] == pytest.approx(wall)
        # the doctor's pairs: median (min) of the measured ones with that P2P setting, only where there is a peer
        expected = {"on": (260.0, 250.0), "off": (25.0, 20.0)}[p2p] if devices == 2 else None
        if expected is None:
            assert pd.isna(row["busbw_gbs_median"])
        else:
            assert (row["busbw_gbs_median"], row["busbw_gbs_min"]) == expected
        assert row["doctor_verdict"] == "on" and row["doctor_host"] == socket.gethostname()
    assert (out / "scaling.png").read_bytes()[:8] == PNG_SIGNATURE
    md = (out / "report.md").read_text()
    assert "## Scaling over devices" in md and "![scaling](scaling.png)" in md and "`dist.p2p=on`" in md
    assert "260 (min 250) GB/s" in md
    assert "scaling over devices:" in result.stdout


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA device")
def test_on_gpus_a_job_asking_for_one_gpu_too_many_is_skipped_and_the_sweep_goes_on(tmp_path, drivebench_cache):
    """The whole path on a GPU machine: the launcher's device check, the skipped summary, the next job."""
    import torch

    too_many = torch.cuda.device_count() + 1
    sweep_dir = tmp_path / "sweep"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), str(REPO)])),
           "DRIVEBENCH_CACHE": str(drivebench_cache)}
    result = subprocess.run([sys.executable, "-m", "drivebench", "-m", "+experiment=scaling", *TINY,
                             f"dist.devices={too_many},1", "dist.p2p=on", f"hydra.sweep.dir={sweep_dir}"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    skipped = json.loads((sweep_dir / f"0_maptr_max_{too_many}dev_p2p-on" / "summary.json").read_text())
    assert skipped["run"]["status"] == "skipped" and skipped["skipped"]["gpus_here"] == too_many - 1
    assert f"drivebench: skipped: dist.devices={too_many} but this machine has {too_many - 1} GPU(s)" in result.stderr
    ran = json.loads((sweep_dir / "1_maptr_max_1dev_p2p-on" / "summary.json").read_text())
    assert ran["run"]["status"] == "completed"
