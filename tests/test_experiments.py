"""The named sweeps (drivebench/conf/experiment/*.yaml) compose, job by job, from any working directory.

No training: each job of a sweep is composed with Hydra's compose API (the sweeper's parameters
expanded as Hydra's own override parser expands them), or with ``--cfg job`` in a subprocess.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "drivebench" / "conf"
EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))


def _compose(overrides: list[str], hydra: bool = False):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=overrides, return_hydra_config=hydra)


def sweep_jobs(experiment: str, extra: list[str] | None = None) -> list[list[str]]:
    """The override list of every job the basic sweeper would launch for ``+experiment=<name>``."""
    cfg = _compose([f"+experiment={experiment}", *(extra or [])], hydra=True)
    params = OmegaConf.to_container(cfg.hydra.sweeper.params) or {}
    parsed = OverridesParser.create().parse_overrides([f"{k}={v}" for k, v in params.items()])
    jobs: list[list[str]] = [[]]
    for override in parsed:
        values = list(override.sweep_string_iterator()) if override.is_sweep_override() else [
            override.get_value_element_as_str()]
        jobs = [[*job, f"{override.get_key_element()}={v}"] for job in jobs for v in values]
    return jobs


def test_the_experiments_are_packaged_config_groups():
    # no search-path plugin: experiment/ and accel_step/ are groups of the packaged config itself
    from drivebench.compose import compose

    assert (CONF / "experiment" / "smoke.yaml").is_file() and (CONF / "accel_step" / "none.yaml").is_file()
    cfg = compose(["+experiment=accel_ablation", "accel_step=pool"], return_hydra_config=True)
    assert cfg.accel.name == "pool" and cfg.hydra.runtime.choices["accel_step"] == "pool"
    main = next(s for s in cfg.hydra.runtime.config_sources if s.provider == "main")
    assert (main.schema, main.path) == ("pkg", "drivebench.conf")  # the package, not a folder of the checkout


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_job_of_every_experiment_composes(experiment):
    jobs = sweep_jobs(experiment)
    assert len(jobs) >= 2, f"{experiment} sweeps nothing"
    for job in jobs:
        cfg = _compose([f"+experiment={experiment}", *job])
        for key in ("model", "accel", "bench", "machine", "data", "trainer"):
            OmegaConf.to_container(cfg[key], resolve=True)  # every interpolation of the job resolves


def test_smoke_is_two_tiny_jobs_without_checkpoints():
    jobs = sweep_jobs("smoke")
    assert [j for j in jobs] == [["accel=none"], ["accel=max"]]
    cfg = _compose(["+experiment=smoke", "accel=max"])
    assert cfg.ckpt.name == "none" and cfg.data.size == "mini"
    assert cfg.model.size == "test"
    assert cfg.bench.warmup_steps + cfg.bench.steps <= 10


def _accel(step: str) -> dict:
    return OmegaConf.to_container(_compose(["+experiment=accel_ablation", f"accel_step={step}"]).accel)


def _preset(name: str) -> dict:
    return OmegaConf.to_container(_compose([f"accel={name}"]).accel)


def test_accel_ablation_adds_knobs_one_step_at_a_time():
    steps = [job[0].split("=", 1)[1] for job in sweep_jobs("accel_ablation")]
    assert steps[0] == "none" and steps[-1] == "max" and len(steps) >= 6
    knobs = [_accel(s) for s in steps]
    baseline = _preset("none")
    for name, accel in zip(steps, knobs):
        assert accel["name"] == name  # recorded as run.accel, so the report labels the step
    for before, after, name in zip(knobs, knobs[1:], steps[1:]):
        added = {k for k in after if k != "name" and after[k] != before[k]}
        assert added, f"step {name} adds no knob"
        # nothing a step turned on is turned back off later (only max may refine a value)
        if name != "max":
            assert all(before[k] == after[k] for k in before if k != "name" and before[k] != baseline[k])
    without_name = lambda d: {k: v for k, v in d.items() if k != "name"}  # noqa: E731
    assert without_name(knobs[0]) == without_name(baseline)
    assert without_name(_accel("cpu")) == without_name(_preset("cpu"))
    assert without_name(knobs[-1]) == without_name(_preset("max"))
    # compile = every knob accel=cpu sets plus every knob accel=torch sets
    def set_by(preset: str) -> dict:
        return {k: v for k, v in _preset(preset).items() if k != "name" and v != baseline[k]}

    compiled = _accel("compile")
    assert {k: compiled[k] for k in {**set_by("cpu"), **set_by("torch")}} == {**set_by("cpu"), **set_by("torch")}


def test_accel_ablation_steps_start_from_none_not_the_default_preset():
    # the root config defaults to accel=max; an early step must not inherit max's knobs
    pool = _accel("pool")
    assert pool["precision"] == _preset("none")["precision"] != _preset("max")["precision"]
    assert pool["num_workers"] == 0
    cfg = _compose(["+experiment=accel_ablation", "accel_step=pool"], hydra=True)
    assert cfg.hydra.runtime.choices.accel == "none"  # the recorded group choice agrees


def test_machine_compare_varies_only_the_machine():
    jobs = sweep_jobs("machine_compare")
    assert jobs == [["machine=h200"], ["machine=a100"]]
    composed = [_compose(["+experiment=machine_compare", *job]) for job in jobs]
    assert {c.machine.name for c in composed} == {"h200", "a100"}
    for key in ("model", "accel", "bench", "data", "trainer"):
        values = {OmegaConf.to_yaml(c[key]) for c in composed}
        assert len(values) == 1, f"machine_compare changes {key} between machines"
    assert composed[0].accel.name == "max" and composed[0].bench.mode == "train"


def test_experiments_compose_outside_the_repo(tmp_path):
    """A subprocess started elsewhere (drivebench importable, as after `pip install -e .`)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-m", "drivebench", "+experiment=smoke", "accel=none", "--cfg", "job"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    cfg = OmegaConf.create(result.stdout)
    assert cfg.ckpt.name == "none" and cfg.accel.name == "none"


def test_paper_batch_runs_the_global_batch_on_one_device_at_the_papers_rate():
    jobs = sweep_jobs("paper_batch")
    composed = [_compose(["+experiment=paper_batch", *job]) for job in jobs]
    assert sorted(c.model.batch_size for c in composed) == [4, 32]
    assert {c.model.name for c in composed} == {"qcnet"}
    assert {c.model.optimizer.lr for c in composed} == {5.0e-4}
    assert {c.dist.name for c in composed} == {"single"}


@pytest.mark.parametrize("model", ["qcnet", "maptr", "sparsedrive", "gaussianformer"])
def test_convergence_trains_none_and_max_over_two_seeds_for_the_models_epochs(model):
    jobs = sweep_jobs("convergence", [f"model={model}"])
    assert sorted(jobs) == sorted([[f"accel={a}", f"seed={s}"] for a in ("none", "max") for s in (2023, 2024)])
    cfg = _compose(["+experiment=convergence", f"model={model}", "accel=max", "seed=2024"])
    trainer, bench = OmegaConf.to_container(cfg.trainer, resolve=True), OmegaConf.to_container(cfg.bench, resolve=True)
    assert trainer["max_epochs"] == cfg.model.convergence.max_epochs >= 2
    assert trainer["check_val_every_n_epoch"] == 1 and trainer["max_steps"] == -1
    assert bench["val_batches"] == "all" and bench["ceiling"] is False and cfg.ckpt.name == "none"
    assert bench["targets"] and all(t.startswith("val/") for t in bench["targets"])
    assert OmegaConf.to_container(cfg.model.scheduler, resolve=True) == OmegaConf.to_container(
        cfg.model.convergence.scheduler, resolve=True)
    if model == "qcnet":  # the cosine follows the run's epochs, also when they are overridden
        shorter = _compose(["+experiment=convergence", "model=qcnet", "trainer.max_epochs=2"])
        assert shorter.model.scheduler.T_max == 2
