"""drivebench.dist and drivebench.cli in-process: p2p, devices, backend, rank commands, teardown, samplers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf, open_dict

from drivebench import dist
from drivebench.cli import pop_local_rank
from drivebench.data.sampling import RandomBatchSampler
from drivebench.data.streaming import SequenceGroupedBatchSampler
from drivebench.errors import ConfigError
from drivebench.hardware import nvml
from drivebench.hardware.p2p import P2PVerdict, current_machine_key, write_verdict
from drivebench.perf.machine import GPUInfo, MachineInfo

CONF = Path(__file__).resolve().parents[1] / "drivebench" / "conf"


def compose_cfg(*overrides: str, hydra: bool = False):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=list(overrides), return_hydra_config=hydra)


# ---- dist.p2p -----------------------------------------------------------------------------------
@pytest.fixture
def two_h200(monkeypatch):
    monkeypatch.setattr(nvml, "visible_gpu_names", lambda: ["NVIDIA H200", "NVIDIA H200"])
    monkeypatch.setattr(nvml, "driver_info", lambda: ("570.86.15", "12.8"))


@pytest.mark.parametrize("value, expected, disable, level", [
    ("on", "on", None, None), (True, "on", None, None),  # YAML reads a bare on/off as a boolean
    ("off", "off", "1", None), ("OFF", "off", "1", None), (False, "off", "1", None),
    ("NVL", "NVL", None, "NVL"), ("pxb", "PXB", None, "PXB"),
])
def test_p2p_values_set_nccl_variables(value, expected, disable, level):
    env = {"NCCL_P2P_DISABLE": "0", "NCCL_P2P_LEVEL": "SYS", "NCCL_DEBUG": "WARN"}
    applied = dist.apply_p2p(value, environ=env)
    assert env.get("NCCL_P2P_DISABLE") == disable and env.get("NCCL_P2P_LEVEL") == level
    assert env["NCCL_DEBUG"] == "WARN"  # other NCCL settings are the user's
    assert applied["applied"] == expected and applied["source"] == "config"
    assert applied["env"] == {k: v for k, v in env.items() if k.startswith("NCCL_")}


def test_p2p_auto_without_a_doctor_verdict_leaves_nccl_alone(tmp_path, two_h200):
    env = {"NCCL_P2P_DISABLE": "1"}
    applied = dist.apply_p2p("auto", cache_dir=str(tmp_path), environ=env)
    assert env == {"NCCL_P2P_DISABLE": "1"}
    assert applied["applied"] == "nccl-default" and "no doctor verdict" in applied["source"]
    assert dist.apply_p2p("auto", cache_dir=None, environ={})["applied"] == "nccl-default"


@pytest.mark.parametrize("verdict, disable, level", [("off", "1", None), ("PHB", None, "PHB"), ("on", None, None)])
def test_p2p_auto_applies_the_doctor_verdict(tmp_path, two_h200, verdict, disable, level):
    write_verdict(tmp_path, current_machine_key(), P2PVerdict(verdict, "test"), [])
    env = {"NCCL_P2P_LEVEL": "SYS"}
    applied = dist.apply_p2p("auto", cache_dir=str(tmp_path), environ=env)
    assert applied["source"] == "doctor cache" and applied["applied"] == verdict
    assert env.get("NCCL_P2P_DISABLE") == disable and env.get("NCCL_P2P_LEVEL") == level


def test_p2p_auto_ignores_a_verdict_for_other_gpus(tmp_path, two_h200):
    write_verdict(tmp_path, "8x[NVIDIA A100-SXM4-80GB] driver 535", P2PVerdict("off", "other machine"), [])
    assert dist.apply_p2p("auto", cache_dir=str(tmp_path), environ={})["applied"] == "nccl-default"


def test_p2p_invalid_value_is_a_one_line_error():
    with pytest.raises(ConfigError) as err:
        dist.apply_p2p("sometimes", environ={})
    assert "\n" not in str(err.value)
    assert "dist.p2p='sometimes'" in str(err.value) and "auto, on, off, LOC" in str(err.value)


def test_the_training_path_does_not_import_the_doctor(tmp_path):
    # dist.p2p=auto reads the verdict through drivebench.hardware, which the doctor also writes through
    code = ("import sys, drivebench.app, drivebench.bench.runners, drivebench.dist, drivebench.perf.system; "
            f"drivebench.dist.apply_p2p('auto', cache_dir={str(tmp_path)!r}, environ={{}}); "
            "drivebench.perf.system.SystemMonitor(0).start(); "
            "print(sorted(m for m in sys.modules if m.startswith('drivebench.doctor')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# ---- devices, backend, launch environment --------------------------------------------------------
def ddp_cfg(**values):
    return OmegaConf.merge(compose_cfg("dist=ddp").dist, values)


def test_devices_beyond_the_gpus_present_are_refused():
    with pytest.raises(ConfigError, match=r"dist.devices=2 but this machine has 1 GPU\(s\)"):
        dist.resolve_devices(ddp_cfg(devices=2), num_gpus=1, accelerator="gpu")
    assert dist.resolve_devices(ddp_cfg(devices="auto"), num_gpus=8, accelerator="gpu") == 8
    assert dist.resolve_devices(ddp_cfg(devices=4), num_gpus=0, accelerator="cpu") == 4  # CPU processes
    for bad in (0, "two", True):
        with pytest.raises(ConfigError, match="dist.devices"):
            dist.resolve_devices(ddp_cfg(devices=bad), num_gpus=2, accelerator="gpu")


def test_a_pretend_one_gpu_machine_refuses_two_devices_before_any_work(monkeypatch, tmp_path):
    from drivebench import app

    one_gpu = MachineInfo(hostname="h", cpu_model="c", cpu_cores=16, ram_gb=64.0, shm_gb=32.0, shm_free_gb=32.0,
                          accelerator="cuda", gpus=[GPUInfo(0, "NVIDIA H200", 140.0, "9.0")])
    monkeypatch.setattr(app, "detect_machine", lambda accelerator: one_gpu)
    monkeypatch.setenv("DRIVEBENCH_CACHE", str(tmp_path))
    cfg = compose_cfg("model=maptr", "model.size=test", "accel=none", "dist=ddp", "dist.devices=2", "ckpt=none")
    with pytest.raises(ConfigError, match="dist.devices=2 but this machine has 1 GPU"):
        app.build_run(cfg, tmp_path, progress=False)
    assert not list(tmp_path.iterdir())  # nothing generated or written


def test_backend_checks():
    with pytest.raises(ConfigError, match="dist.backend=nccl needs GPUs"):
        dist.build_strategy(ddp_cfg(backend="nccl"), accelerator="cpu")
    with pytest.raises(ConfigError, match="dist.backend='tcp' is not valid"):
        dist.build_strategy(ddp_cfg(backend="tcp"), accelerator="cpu")
    with pytest.raises(ConfigError, match="dist.timeout_minutes"):
        dist.build_strategy(ddp_cfg(timeout_minutes=0), accelerator="cpu")
    strategy = dist.build_strategy(ddp_cfg(timeout_minutes=0.5), accelerator="cpu")
    assert strategy.process_group_backend == "gloo" and strategy._timeout.total_seconds() == 30
    assert dist.build_strategy(compose_cfg().dist, accelerator="cpu") == "auto"


def test_local_rank_without_a_launcher_is_refused_for_ddp(monkeypatch):
    with pytest.raises(ConfigError, match=r"LOCAL_RANK=0 is set .*\(WORLD_SIZE is not set\)"):
        dist.check_launch_env({"LOCAL_RANK": "0"})
    dist.check_launch_env({"LOCAL_RANK": "1", "WORLD_SIZE": "2"})  # torchrun, Lightning's own ranks
    dist.check_launch_env({})
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(ConfigError, match="LOCAL_RANK"):
        dist.build_strategy(ddp_cfg(), accelerator="cpu")


# ---- command line: legacy local-rank flags ------------------------------------------------------
@pytest.mark.parametrize("argv", [["--local_rank=1"], ["--local-rank=1"], ["--local_rank", "1"], ["--local-rank", "1"]])
def test_local_rank_flags_are_removed_and_exported(argv):
    env: dict[str, str] = {}
    assert pop_local_rank(["model=maptr", *argv, "accel=none"], env) == ["model=maptr", "accel=none"]
    assert env == {"LOCAL_RANK": "1"}


def test_local_rank_flag_without_a_number_is_a_clear_error():
    with pytest.raises(SystemExit, match="--local-rank needs a rank number"):
        pop_local_rank(["--local-rank", "model=maptr"], {})


# ---- external launchers: ranks > 0 in scratch -----------------------------------------------------
def test_torchrun_ranks_above_zero_run_in_scratch():
    assert dist.external_rank_overrides({"RANK": "0", "TORCHELASTIC_RUN_ID": "x"}) == []
    assert dist.external_rank_overrides({"RANK": "1"}) == []  # no launcher we know: leave it alone
    assert dist.external_rank_overrides({}) == []
    for env in ({"RANK": "1", "TORCHELASTIC_RUN_ID": "x"}, {"SLURM_PROCID": "3"}):
        overrides = dist.external_rank_overrides(env)
        run_dir = next(o for o in overrides if o.startswith("hydra.run.dir=")).split("=", 1)[1].strip('"')
        assert Path(run_dir).is_dir() and f'hydra.sweep.dir="{run_dir}"' in overrides
        assert "hydra.output_subdir=null" in overrides


# ---- Lightning's rank command under Hydra -------------------------------------------------------
def test_rank_command_runs_only_this_job(tmp_path):
    job_dir = tmp_path / "sweep" / "0_k=v,w"  # override_dirname-style names hold = and ,
    cfg = compose_cfg("model=maptr", "accel=none", "dist=ddp", hydra=True)
    with open_dict(cfg):
        cfg.hydra.runtime.output_dir = str(job_dir)
        cfg.hydra.runtime.cwd = str(tmp_path)
        cfg.hydra.overrides.hydra = ["hydra.sweep.dir=/somewhere", "hydra.searchpath=[file:///extra]",
                                     "hydra/launcher=basic", "hydra.mode=MULTIRUN"]
    HydraConfig.instance().set_config(cfg)
    try:
        command, cwd = dist._rank_command(local_rank=1)
    finally:
        HydraConfig.instance().cfg = None  # other tests must not see this job's Hydra config
    assert command[:3] == [sys.executable, "-m", "drivebench"] and cwd == str(tmp_path)
    assert "-m" not in command[3:] and "--multirun" not in command
    assert command[3] == "hydra.searchpath=[file:///extra]"
    assert command[4:7] == ["model=maptr", "accel=none", "dist=ddp"]
    assert f'hydra.run.dir="{job_dir}"' in command and "hydra.output_subdir=null" in command
    assert not any(o.startswith(("hydra.sweep", "hydra/launcher", "hydra.mode")) for o in command)
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides([o for o in command[3:] if not o.startswith("--")])
    assert not any(o.is_sweep_override() for o in parsed)  # the quoted job dir is one value, not a sweep


def test_patch_replaces_lightnings_launch_hooks():
    from lightning.fabric.strategies.launchers import subprocess_script as fabric_launcher
    from lightning.pytorch.strategies.launchers import subprocess_script as trainer_launcher

    dist.patch_rank_launch_command()
    for module in (fabric_launcher, trainer_launcher):
        assert module._hydra_subprocess_cmd is dist._rank_command
        assert module._launch_process_observer is dist._watch_rank_processes


# ---- a rank that dies; teardown -----------------------------------------------------------------
def child(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code])


def job_with(procs):
    trainer = SimpleNamespace(strategy=SimpleNamespace(launcher=SimpleNamespace(procs=procs)), callbacks=[])
    job = dist.DistJob(child_timeout_s=20, failed_child_timeout_s=5)
    job.track(trainer)
    return job


def test_distjob_restores_the_environment_and_names_a_rank_that_failed(monkeypatch):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.setenv("MASTER_PORT", "1234")
    failing = child("import sys; sys.exit(7)")
    with pytest.raises(dist.RankFailed, match=rf"rank 2 \(pid {failing.pid}\) exited with code 7"):
        with job_with([child("pass"), failing]):
            os.environ["LOCAL_RANK"] = "0"
            os.environ["MASTER_PORT"] = "999"
    assert "LOCAL_RANK" not in os.environ and os.environ["MASTER_PORT"] == "1234"


def test_distjob_stops_live_ranks_when_this_rank_fails(capsys):
    stuck = child("import time; time.sleep(120)")
    with pytest.raises(ZeroDivisionError):
        with job_with([stuck]):
            1 / 0
    assert stuck.poll() is not None  # killed, not left waiting in a collective
    assert f"while rank 1 (pid {stuck.pid}) still ran" in capsys.readouterr().err


def test_rank_watch_names_the_dead_rank_and_ends_the_launcher(monkeypatch, capsys):
    class Exited(Exception):
        pass

    def fake_exit(code):
        raise Exited(code)

    monkeypatch.setattr(os, "_exit", fake_exit)
    healthy, dead = child("import time; time.sleep(120)"), child("import os; os._exit(13)")
    watch = dist.RankWatch([healthy, dead], poll_s=0.05, grace_s=0)
    with pytest.raises(Exited):
        watch.run()
    assert watch.failed and f"rank 2 (pid {dead.pid}) exited with code 13" in capsys.readouterr().err
    assert healthy.wait(timeout=10) < 0  # the other rank was killed


def test_a_rank_whose_launcher_is_gone_exits_even_when_its_stderr_is_gone_too():
    """A killed launcher (rank 0) takes the reading end of the ranks' stderr pipe with it: the watch's message
    then fails with EPIPE, and before 2026-12-05 that ended the watch thread instead of the rank, which stayed
    orphaned, waiting on its loader forever (a clean-clone CI run left one behind)."""
    code = ("import time; from drivebench import dist\n"
            "dist.LauncherWatch(launcher_pid=-1, local_rank=1, poll_s=0.01, grace_s=0.5).start()\n"
            "time.sleep(120)\n")
    rank = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    rank.stderr.close()  # the launcher and its end of the pipe are gone before the watch speaks
    try:
        assert rank.wait(timeout=90) == 1
    finally:
        rank.kill()


def test_fault_injection_is_off_unless_asked():
    assert dist.ExitRankAtStep.from_env({}) is None
    fault = dist.ExitRankAtStep.from_env({"DRIVEBENCH_FAULT_EXIT_RANK": "1", "DRIVEBENCH_FAULT_HANG": "1"})
    assert (fault.rank, fault.step, fault.hang) == (1, 2, True)


# ---- samplers: no two ranks see the same sample in an epoch --------------------------------------
def epoch_indices(sampler, epoch):
    sampler.set_epoch(epoch)
    return [i for batch in sampler for i in batch]


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("drop_last", [True, False])
def test_random_batch_sampler_splits_every_epoch(world, drop_last):
    n = 50
    for epoch in range(3):
        ranks = [epoch_indices(RandomBatchSampler(n, 4, drop_last=drop_last, num_replicas=world, rank=r, seed=5),
                               epoch) for r in range(world)]
        assert len({len(r) for r in ranks}) == 1  # same number of samples: no rank waits at the end
        if drop_last:
            seen = [i for r in ranks for i in r]
            assert len(seen) == len(set(seen)) and set(seen) <= set(range(n))
        else:  # padded by wrapping around: every sample is seen, repeats only to even the ranks out
            assert set().union(*ranks) == set(range(n)) and sum(map(len, ranks)) - n < world * 4


@pytest.mark.parametrize("world", [2, 4])
def test_streaming_sampler_gives_each_sequence_to_one_rank(world):
    sequence_ids = [s for s in range(12) for _ in range(5)]
    frame_idx = [f for _ in range(12) for f in range(5)]
    for epoch in range(3):
        ranks = [epoch_indices(SequenceGroupedBatchSampler(sequence_ids, frame_idx, 2, num_replicas=world, rank=r,
                                                           seed=1), epoch) for r in range(world)]
        sequences = [{sequence_ids[i] for i in r} for r in ranks]
        assert all(not (a & b) for k, a in enumerate(sequences) for b in sequences[k + 1:])


def test_datamodule_takes_world_and_rank_from_the_trainer():
    from drivebench.data.datamodule import DriveDataModule

    dm = object.__new__(DriveDataModule)  # only the sampling state; no dataset is needed for this
    dm.batch_size, dm.seed, dm.batch_sampler_factory = 2, 3, None
    dataset = list(range(20))
    dm.trainer = SimpleNamespace(world_size=2, global_rank=1)
    sampler = dm.make_batch_sampler(dataset)
    assert (sampler.num_replicas, sampler.rank) == (2, 1)
    dm.trainer = SimpleNamespace(world_size=2, global_rank=0)
    other = dm.make_batch_sampler(dataset)
    assert not {i for b in sampler for i in b} & {i for b in other for i in b}


def test_summary_records_p2p_json_ready():
    applied = dist.apply_p2p("off", environ={})
    assert json.loads(json.dumps(applied)) == applied


def test_external_launchers_keep_the_group_between_jobs():
    assert dist.launched_externally({"TORCHELASTIC_RUN_ID": "x"})
    assert dist.launched_externally({"SLURM_PROCID": "0", "SLURM_NTASKS": "8"})
    assert not dist.launched_externally({"SLURM_PROCID": "0", "SLURM_NTASKS": "1"})  # Lightning launches
    assert not dist.launched_externally({"LOCAL_RANK": "1", "WORLD_SIZE": "2"})  # a rank Lightning started
