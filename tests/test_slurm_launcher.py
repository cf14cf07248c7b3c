"""hydra/launcher=drivebench_slurm without a cluster: per-job resources from machine profiles, the
submitit parameters they become, and a dry-run multirun that writes the sbatch scripts."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from drivebench.errors import ConfigError
from hydra_plugins.drivebench_slurm import launcher as slurm_launcher
from hydra_plugins.drivebench_slurm.resources import job_resources

REPO = Path(__file__).resolve().parents[1]


def job_cfg(*overrides: str):
    with initialize_config_dir(config_dir=str(REPO / "drivebench" / "conf"), version_base="1.3"):
        return compose("config", overrides=["hydra/launcher=drivebench_slurm", *overrides])


def test_each_machine_profile_gives_its_own_resources():
    h200, a100 = job_resources(job_cfg("machine=h200")), job_resources(job_cfg("machine=a100"))
    assert h200 == {"name": "drivebench-h200-qcnet", "nodes": 1, "tasks_per_node": 1, "gpus_per_node": 1,
                    "cpus_per_task": 16, "mem_gb": 128, "timeout_min": 60, "partition": "h200", "account": None,
                    "qos": None, "constraint": None}
    assert (a100["partition"], a100["cpus_per_task"], a100["mem_gb"]) == ("a100", 8, 64)


def test_ddp_across_nodes_asks_for_one_task_per_gpu_on_every_node():
    cfg = job_cfg("machine=h200", "machine.gpus_per_node=8", "dist=ddp", "dist.num_nodes=2",
                  "machine.slurm.account=perception", "machine.slurm.qos=high", "machine.slurm.constraint=nvlink")
    res = job_resources(cfg)
    assert (res["nodes"], res["tasks_per_node"], res["gpus_per_node"]) == (2, 8, 8)  # Lightning: ntasks == devices
    assert (res["cpus_per_task"], res["mem_gb"]) == (16, 8 * 128)
    assert (res["account"], res["qos"], res["constraint"]) == ("perception", "high", "nvlink")
    fewer = job_resources(job_cfg("machine=h200", "machine.gpus_per_node=8", "dist=ddp", "dist.devices=2"))
    assert (fewer["tasks_per_node"], fewer["gpus_per_node"], fewer["mem_gb"]) == (2, 2, 256)
    single = job_resources(job_cfg("machine=h200", "machine.gpus_per_node=8"))  # dist=single: one GPU
    assert (single["tasks_per_node"], single["gpus_per_node"]) == (1, 1)


@pytest.mark.parametrize("overrides, message", [
    (["machine=local"], "machine=local has no slurm block"),
    (["machine=h200", "dist=ddp", "dist.devices=4"], "dist.devices=4 but machine=h200 gives a job 1 GPU"),
    (["machine=h200", "dist.num_nodes=2"], "dist.num_nodes=2 needs dist=ddp"),
    (["machine=h200", "machine.accelerator=cpu"], "SLURM dispatch needs a GPU profile"),
    (["machine=a100", "machine.cpus_per_gpu=0"], "machine.cpus_per_gpu=0"),
])
def test_profiles_that_cannot_be_submitted_say_why(overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        job_resources(job_cfg(*overrides))


def test_profile_values_win_and_launcher_values_fill_the_gaps():
    launcher_params = {"submitit_folder": "/x/%j", "max_num_timeout": 0, "timeout_min": 30, "partition": "debug",
                       "account": "fallback", "setup": ["source venv/bin/activate"], "additional_parameters": {}}
    params = slurm_launcher.submission_parameters(launcher_params, job_resources(job_cfg("machine=a100")))
    assert params["slurm_partition"] == "a100" and params["timeout_min"] == 60  # the profile's
    assert params["slurm_account"] == "fallback"  # the profile leaves it null
    assert params["slurm_setup"] == ["source venv/bin/activate"]
    assert "submitit_folder" not in params and "slurm_max_num_timeout" not in params
    import submitit

    executor = submitit.AutoExecutor(folder="/tmp/unused", cluster="debug")
    executor.update_parameters(**params)  # submitit accepts every name (it checks the slurm_ ones too)


def test_a_task_of_rank_above_zero_keeps_out_of_rank_zeros_files(monkeypatch):
    base = slurm_launcher.DrivebenchSlurmLauncher.__mro__[1]  # submitit's launcher runs the job: echo its overrides
    monkeypatch.setattr(base, "__call__", lambda self, overrides, *args: overrides)
    launcher = slurm_launcher.DrivebenchSlurmLauncher(submitit_folder="/x/%j")
    monkeypatch.setenv("SLURM_PROCID", "3")
    assert launcher(["machine=h200"], "hydra.sweep.dir", 0, "id", {}) == [
        "machine=h200", "hydra.output_subdir=null", "hydra.job.name=rank3"]
    monkeypatch.setenv("SLURM_PROCID", "0")
    assert launcher(["machine=h200"], "hydra.sweep.dir", 0, "id", {}) == ["machine=h200"]


def run_sweep(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "DRIVEBENCH_CACHE": str(tmp_path / "cache")}
    return subprocess.run([sys.executable, "-m", "drivebench", "-m", "hydra/launcher=drivebench_slurm",
                           "hydra.launcher.dry_run=true", f"hydra.sweep.dir={tmp_path / 'sweep'}", *overrides],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def sbatch_flags(script: str) -> dict[str, str]:
    return dict(re.findall(r"^#SBATCH --([\w-]+)=(\S+)$", script, flags=re.M))


def test_one_multirun_dispatches_to_two_kinds_of_machine(tmp_path):
    result = run_sweep(tmp_path, "machine=h200,a100", "seed=1,2", "dist=ddp", "dist.num_nodes=2")
    assert result.returncode == 0, result.stderr[-3000:]
    out = tmp_path / "sweep" / ".submitit" / "dry_run"
    jobs = json.loads((out / "jobs.json").read_text())
    assert sorted(jobs) == ["0", "1", "2", "3"]
    by_machine = {}
    for job in jobs.values():
        machine = next(o for o in job["overrides"] if o.startswith("machine=")).split("=")[1]
        by_machine.setdefault(machine, set()).add(job["sbatch"])
    assert by_machine.keys() == {"h200", "a100"} and all(len(s) == 1 for s in by_machine.values())
    assert by_machine["h200"] != by_machine["a100"]  # one array per kind of machine
    expected = {"h200": {"partition": "h200", "cpus-per-task": "16", "mem": "128GB"},
                "a100": {"partition": "a100", "cpus-per-task": "8", "mem": "64GB"}}
    for machine, (script,) in by_machine.items():
        flags = sbatch_flags((out / script).read_text())
        assert {k: flags[k] for k in expected[machine]} == expected[machine]
        assert (flags["nodes"], flags["ntasks-per-node"], flags["gpus-per-node"]) == ("2", "1", "1")
        assert flags["time"] == "60" and flags["array"] == "0-1%2"  # the two seeds of this machine
        assert flags["job-name"] == f"drivebench-{machine}-qcnet"
        assert re.search(r"^srun .*--kill-on-bad-exit=1 .*submitit", (out / script).read_text(), flags=re.M)
    assert not list((tmp_path / "sweep").glob("*/summary.json")) and not (tmp_path / "outputs").exists()


def test_a_profile_without_slurm_stops_the_sweep_before_submitting(tmp_path):
    result = run_sweep(tmp_path, "machine=h200,local")
    assert result.returncode != 0
    assert "machine=local has no slurm block" in result.stderr
    assert not (tmp_path / "sweep" / ".submitit").exists()


def test_plugin_modules_import_without_submitit():
    """Hydra imports every plugin module on every run: a missing optional extra must not break them."""
    code = ("import sys; sys.modules['hydra_plugins.hydra_submitit_launcher.submitit_launcher'] = None\n"
            "from hydra_plugins.drivebench_slurm import launcher\n"
            "try:\n    launcher.DrivebenchSlurmLauncher(submitit_folder='x')\n"
            "except ImportError as err:\n    print(err)\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "pip install 'drivebench[slurm]'" in result.stdout
