"""Every option of every config group composes against its schema and instantiates at CPU test sizes;
a bad override is refused by the composition with one line naming the key, exit 2, before any work.

Nothing here trains: each group's objects are built the way a run builds them (``build_run`` for a
model, the partial Trainer, the callbacks, the data source, the strategy), and no data is generated.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

import lightning.pytorch as pl
import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from drivebench.accel.settings import AccelSettings
from drivebench.compose import compose, sweep_jobs
from drivebench.errors import ConfigError
from drivebench.perf.machine import GPUInfo, MachineInfo

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "drivebench" / "conf"
GROUPS = sorted(p.name for p in CONF.iterdir() if p.is_dir() and p.name not in ("hydra", "__pycache__"))
OPTIONS = [(group, p.stem) for group in GROUPS for p in sorted((CONF / group).glob("*.yaml"))]
READS = {"argoverse2": "qcnet", "nuscenes": "maptr", "mmdet3d": "mmdet3d"}  # data -> a model that reads it
NEEDS_OPENMMLAB = {("model", "mmdet3d"), ("data", "mmdet3d"), ("bench", "mmengine")}
CPU = MachineInfo(hostname="h", cpu_model="x", cpu_cores=2, ram_gb=8, shm_gb=4, shm_free_gb=4, accelerator="cpu",
                  gpus=[], bf16_supported=False)
H200 = MachineInfo(hostname="h", cpu_model="x", cpu_cores=16, ram_gb=128, shm_gb=64, shm_free_gb=60,
                   accelerator="cuda", gpus=[GPUInfo(0, "NVIDIA H200", 139.0, "9.0")], bf16_supported=True)


@pytest.fixture(autouse=True)
def _cpu_sizes(monkeypatch):
    monkeypatch.setenv("DRIVEBENCH_FORCE_CPU", "1")  # ${on_gpu:...} -> the CPU test size everywhere


def _base(tmp_path: Path) -> list[str]:
    return [f"paths.output_dir={tmp_path}", f"paths.cache={tmp_path / 'cache'}", "accel=none", "ckpt=none"]


def _no_missing(cfg, key: str, allowed: tuple[str, ...] = ()) -> None:
    missing = sorted(set(OmegaConf.missing_keys(cfg[key])) - set(allowed))
    assert not missing, f"{key}: no value for {missing}"


def _trainer(cfg) -> pl.Trainer:
    make = instantiate(cfg.trainer)
    assert isinstance(make, functools.partial) and make.func is pl.Trainer
    steps = cfg.trainer.max_steps if cfg.trainer.max_steps is not None else 3
    return make(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, enable_checkpointing=False,
                max_steps=steps)


def _callbacks(cfg) -> list[pl.Callback]:
    from drivebench.perf.callback import StepTimer

    built = []
    for name, node in cfg.callbacks.items():
        obj = instantiate(node)
        if name == "step_timer":
            obj = obj(phase="perf", warmup_steps=1, monitor=None)
            assert isinstance(obj, StepTimer) and obj.log_every_n_steps == cfg.trainer.log_every_n_steps
        built.append(obj)
    assert all(isinstance(c, pl.Callback) for c in built)
    return built


def _instantiate(group: str, option: str, cfg, tmp_path: Path) -> None:
    if group in ("accel", "accel_step"):
        for machine in (CPU, H200):
            settings = AccelSettings.resolve(OmegaConf.to_container(cfg.accel, resolve=True), machine)
            assert settings.name == cfg.accel.name
    elif group == "bench":
        from hydra.utils import get_class

        assert type(instantiate(cfg.bench)) is get_class(cfg.bench._target_)
    elif group == "callbacks":
        _callbacks(cfg)
    elif group == "ckpt":
        from lightning.fabric.plugins import CheckpointIO

        assert isinstance(instantiate(cfg.ckpt.io, _convert_="all"), CheckpointIO)
        if cfg.ckpt.callback is not None:
            assert isinstance(instantiate(cfg.ckpt.callback, _convert_="all"), pl.Callback)
    elif group == "data":
        source = instantiate(cfg.data.source)
        assert callable(source.prepare) and callable(source.describe)
    elif group == "dist":
        from drivebench.dist import build_strategy, resolve_devices

        assert resolve_devices(cfg.dist, 0, "cpu") >= 1
        build_strategy(cfg.dist, "cpu")
    elif group == "experiment":
        jobs = sweep_jobs([f"+experiment={option}"])
        assert len(jobs) >= 2 and all(f"+experiment={option}" in job for job in jobs)
        for job in jobs[:3]:
            job_cfg = compose(job)
            instantiate(job_cfg.bench)
            _trainer(job_cfg)
    elif group == "logger":
        assert instantiate(cfg.logger).save_dir == str(tmp_path)
    elif group == "machine":
        profile = OmegaConf.to_object(cfg.machine)
        assert profile.name == option
    elif group == "model":
        from drivebench.app import build_run

        run = build_run(cfg, tmp_path, progress=False)
        assert sum(p.numel() for p in run.module.net.parameters()) > 0
        instantiate(cfg.trainer)(**run.trainer_kwargs(), logger=False, enable_progress_bar=False, max_steps=1)
    elif group == "trainer":
        trainer = _trainer(cfg)
        assert trainer.log_every_n_steps == cfg.trainer.log_every_n_steps
        assert trainer.max_epochs == cfg.trainer.max_epochs
    else:
        raise AssertionError(f"no instantiation test for the new group {group!r}: add one here")


def _params():
    for group, option in OPTIONS:
        marks = [pytest.mark.openmmlab] if (group, option) in NEEDS_OPENMMLAB else []
        yield pytest.param(group, option, marks=marks, id=f"{group}={option}")


@pytest.mark.parametrize("group, option", list(_params()))
def test_every_option_of_every_group_composes_and_instantiates(group, option, tmp_path, request):
    if (group, option) in NEEDS_OPENMMLAB:
        request.getfixturevalue("openmmlab_stack")
    selector = {"experiment": f"+experiment={option}",
                "accel_step": "+experiment=accel_ablation"}.get(group, f"{group}={option}")
    extra = [f"accel_step={option}"] if group == "accel_step" else []
    if group == "data":  # with a model that reads it (another is refused: test_faults_config); mmdet3d's
        extra.append(f"model={READS[option]}")  # source reads model.config
    if group == "ckpt" and option == "remote":
        extra.append("ckpt.dir=memory://drivebench-configs")
    overrides = [*_base(tmp_path), selector, *extra]
    if group in ("accel", "ckpt"):  # the base's choice for this group is the one under test
        overrides = [o for o in overrides if not o.startswith(f"{group}=")] + [f"{group}={option}"]
    cfg = compose(overrides)
    if group not in ("experiment", "accel_step"):
        _no_missing(cfg, group)
    _instantiate(group, option, cfg, tmp_path)


@pytest.mark.parametrize("group, option", sorted(NEEDS_OPENMMLAB), ids=[f"{g}={o}" for g, o in sorted(NEEDS_OPENMMLAB)])
def test_the_openmmlab_options_compose_without_the_stack(group, option, tmp_path):
    """Their schemas are checked here too; instantiating them needs mmcv (the openmmlab test above)."""
    cfg = compose([*_base(tmp_path), "model=mmdet3d", f"{group}={option}"])
    _no_missing(cfg, group)
    assert cfg.data.name == "mmdet3d"


def test_every_group_is_covered_and_typed():
    from drivebench.schemas import SCHEMAS

    assert {"accel", "bench", "ckpt", "dist", "data", "trainer", "callbacks", "model"} <= set(GROUPS)
    cfg = compose([])
    for group in ("accel", "bench", "ckpt", "dist", "data", "trainer", "machine"):
        assert OmegaConf.get_type(cfg[group]) in SCHEMAS.values(), f"{group} has no schema"
    assert OmegaConf.get_type(cfg) is SCHEMAS["schema_config"]


# ---- bad overrides: Hydra refuses them while composing; one line, exit 2, nothing made --------------
def _choices(group: str) -> str:
    return ", ".join(sorted(p.stem for p in (CONF / group).glob("*.yaml")))


@pytest.mark.parametrize("override, words", [
    ("accel.num_worker=4", "accel.num_worker=4 is not a key of accel; valid keys: "),
    ("+accel.num_worker=4", "accel.num_worker=4 is not a key of accel; valid keys: "),
    ("bench.steps=abc", "bench.steps='abc' is not valid; use a whole number >= 0 or 'auto'"),
    ("bench.val_batches=abc", "bench.val_batches='abc' is not valid; use a number of batches >= 0 or 'all'"),
    ("bench.ceiling_warmup_steps=abc", "bench.ceiling_warmup_steps='abc' is not valid; expected a whole number"),
    ("trainer.log_every_n_steps=often", "trainer.log_every_n_steps='often' is not valid; expected a whole number"),
    ("model=nosuch", f"model='nosuch' is not valid; choose one of: {_choices('model')}"),
    ("accel=nosuch", f"accel='nosuch' is not valid; choose one of: {_choices('accel')}"),
    ("bench=nosuch", f"bench='nosuch' is not valid; choose one of: {_choices('bench')}"),
    ("bench.log_every_n_steps=5", "bench.log_every_n_steps=5 is not a key of bench; valid keys: "),
    ("dist.backend=gloo", "dist.backend=gloo is not a key of dist; valid keys: devices, name, num_nodes, strategy"),
    ("seed=abc", "seed='abc' is not valid; expected a whole number"),
    ("+trainer.devices=2", "trainer.devices=2 is not valid: the run sets it from dist.devices"),
    ("+trainer.max_step=3", "trainer.max_step=3 is not a key of trainer nor a lightning.pytorch.Trainer argument"),
    ("model.net.norm_eval=true", "model.net.norm_eval=true is not a key of model.net; valid keys: _target_, "
     "compile_scope, name, output_heads_fp32, size; a keyword of drivebench.models.create_model that the config "
     "does not list: +model.net.norm_eval=true"),
])
def test_a_bad_override_is_refused_in_one_line(override, words, tmp_path, monkeypatch, capsys):
    from drivebench.__main__ import main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stop:
        main([override])
    err = capsys.readouterr().err
    assert stop.value.code == 2
    assert err.startswith(f"drivebench: error: {words}") and len(err.strip().splitlines()) == 1, err
    assert not list(tmp_path.iterdir()), "a run directory was made"


def test_any_other_trainer_argument_can_be_appended():
    cfg = compose(["+trainer.detect_anomaly=true", "+trainer.limit_train_batches=5"])
    trainer = _trainer(cfg)
    assert trainer.limit_train_batches == 5 and cfg.trainer.detect_anomaly is True


def test_the_valid_keys_are_listed():
    with pytest.raises(ConfigError) as caught:
        compose(["accel.num_worker=4"])
    from dataclasses import fields

    from drivebench.schemas import AccelConfig

    listed = str(caught.value).split("valid keys: ", 1)[1].split(", ")
    assert listed == sorted(f.name for f in fields(AccelConfig)) and "num_workers" in listed


@pytest.mark.parametrize("override, key", [("accel.num_worker=4", "accel.num_worker"), ("bench.steps=abc", "bench.steps")])
def test_the_command_exits_2_with_one_line(override, key, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "drivebench", override], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"drivebench: error: {key}"), proc.stderr
    assert not list(tmp_path.iterdir()) and proc.stdout == ""


def test_a_sweep_is_checked_job_by_job_before_any_job_runs(tmp_path, monkeypatch, capsys):
    from drivebench.__main__ import main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stop:
        main(["-m", "accel=none,nosuch", "bench.steps=2"])
    assert stop.value.code == 2 and "accel='nosuch' is not valid" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_help_lists_only_the_real_groups():
    """The config search path is the package alone: nothing under experiments/results (whose run
    folders hold .hydra/ copies of configs) shows up as a group."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "drivebench", "--help"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    section = proc.stdout.split("== Configuration groups ==", 1)[1].split("== Config ==", 1)[0]
    groups = {line.split(":", 1)[0] for line in section.splitlines() if ": " in line and "(group=option)" not in line}
    assert groups == set(GROUPS), sorted(groups ^ set(GROUPS))
    assert ".hydra" not in proc.stdout and "results" not in section


def test_the_resolved_config_prints(tmp_path):
    """``--cfg job --resolve`` (Hydra's way to see every interpolation's value) makes no run directory, so
    ``paths.output_dir`` resolves to null there: it prints the config instead of a traceback."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "drivebench", "model=qcnet", "--cfg", "job", "--resolve"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "output_dir: null" in proc.stdout and "${" not in proc.stdout
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("argv, words", [
    (["-m", "model=qcnet,maptr", "--cfg", "job"], "-m and --cfg cannot be combined"),
    (["--cfg", "job", "--info"], "--cfg and --info cannot be combined"),
    (["--shell-completion"], "--shell-completion needs exactly one of install=SHELL"),
])
def test_hydras_conflicting_flags_are_refused_in_one_line(argv, words, tmp_path, monkeypatch, capsys):
    """Hydra itself refuses these with a ValueError's traceback once it starts."""
    from drivebench.__main__ import main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stop:
        main(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2
    assert err.startswith(f"drivebench: error: {words}") and len(err.strip().splitlines()) == 1, err
    assert not list(tmp_path.iterdir()), "a run directory was made"
