"""The ``drivebench_slurm`` launcher: hydra-submitit-launcher's SLURM launcher, with per-job resources.

hydra-submitit-launcher submits every job of a sweep as one job array with one set of resources.
A sweep across machines needs each job on its own kind of node, so :meth:`launch` composes each
job's config, reads its machine profile (:func:`job_resources`), and submits one array per
distinct set of resources. Values in ``hydra.launcher`` are fallbacks for what a profile leaves
null; ``setup``, ``additional_parameters`` and the other submitit keys pass through unchanged.

``hydra.launcher.dry_run=true`` submits nothing: it writes the sbatch script each array would get
(``<sweep dir>/.submitit/dry_run/``) and a ``jobs.json`` saying which job went where.

Hydra imports this module whenever it scans for plugins (before it is in ``sys.modules``, which
rules out dataclasses here), so it must import without submitit; the launcher then says what to
install when it is used.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import sys
from pathlib import Path
from typing import Any, NamedTuple, Sequence

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from hydra.plugins.launcher import Launcher

from hydra_plugins.drivebench_slurm.resources import describe, job_resources

try:
    from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher as _SubmititSlurmLauncher
except ImportError:  # the optional extra drivebench[slurm] is not installed
    _SubmititSlurmLauncher = None

log = logging.getLogger(__name__)

_INSTALL = "hydra/launcher=drivebench_slurm needs hydra-submitit-launcher: pip install 'drivebench[slurm]'"
# launcher keys given to the executor's constructor, not to update_parameters
_INIT_KEYS = ("submitit_folder", "max_num_timeout")
# submitit's cluster-independent parameters; every other key is SLURM's and gets the slurm_ prefix
_GENERIC = ("name", "timeout_min", "mem_gb", "nodes", "cpus_per_task", "gpus_per_node", "tasks_per_node",
            "stderr_to_stdout")


class _MissingSubmitit(Launcher):
    """Stands in for the submitit launcher when it is not installed: says what to install."""

    def __init__(self, **_: Any) -> None:
        raise ImportError(_INSTALL)

    def setup(self, **_: Any) -> None:
        raise ImportError(_INSTALL)

    def launch(self, *_: Any, **__: Any) -> Sequence[JobReturn]:
        raise ImportError(_INSTALL)


_Base: Any = _SubmititSlurmLauncher if _SubmititSlurmLauncher is not None else _MissingSubmitit


class _Job(NamedTuple):
    idx: int
    overrides: list[str]
    resources: dict[str, Any]


def submission_parameters(launcher_params: dict[str, Any], resources: dict[str, Any]) -> dict[str, Any]:
    """submitit AutoExecutor parameters for one job: the profile's values over the launcher's."""
    merged = {k: v for k, v in launcher_params.items() if k not in _INIT_KEYS}
    merged.update({k: v for k, v in resources.items() if v is not None})
    return {(k if k in _GENERIC else f"slurm_{k}"): v for k, v in merged.items()}


class DrivebenchSlurmLauncher(_Base):  # type: ignore[misc,valid-type]
    """``hydra/launcher=drivebench_slurm`` (drivebench/conf/hydra/launcher/drivebench_slurm.yaml)."""

    def __init__(self, dry_run: bool = False, **params: Any) -> None:
        super().__init__(**params)
        self.dry_run = bool(dry_run)

    # ---- in the submitting process ------------------------------------------------------------
    def plan(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> list[list[_Job]]:
        """Jobs grouped by identical resources (one SLURM array each), in sweep order."""
        assert self.config is not None and self.hydra_context is not None
        groups: dict[str, list[_Job]] = {}
        for idx, overrides in enumerate(job_overrides, start=initial_job_idx):
            job_cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            resources = job_resources(job_cfg)
            log.info(f"\t#{idx} : {' '.join(filter_overrides(overrides))} -> {describe(resources)}")
            key = json.dumps(resources, sort_keys=True, default=str)
            groups.setdefault(key, []).append(_Job(idx, list(overrides), resources))
        return list(groups.values())

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        assert self.config is not None
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        log.info(f"drivebench_slurm {'dry run' if self.dry_run else 'submission'}; sweep output dir: {sweep_dir}")
        submitted: dict[int, Any] = {}
        for group in self.plan(job_overrides, initial_job_idx):
            executor = self._executor(sweep_dir)
            executor.update_parameters(**submission_parameters(self.params, group[0].resources))
            job_args = [(job.overrides, "hydra.sweep.dir", job.idx, f"job_id_for_{job.idx}", Singleton.get_state())
                        for job in group]
            for job, handle in zip(group, executor.map_array(self, *zip(*job_args))):
                submitted[job.idx] = handle
        return [submitted[idx].results()[0] for idx in sorted(submitted)]

    def _executor(self, sweep_dir: Path) -> Any:
        if self.dry_run:
            return DryRunExecutor(sweep_dir / ".submitit" / "dry_run", str(self.params["submitit_folder"]))
        import submitit

        return submitit.AutoExecutor(cluster="slurm", folder=self.params["submitit_folder"],
                                     slurm_max_num_timeout=self.params.get("max_num_timeout", 0))

    # ---- in each SLURM task -------------------------------------------------------------------
    def __call__(self, sweep_overrides: list[str], job_dir_key: str, job_num: int, job_id: str,
                 singleton_state: dict[type, Singleton]) -> JobReturn:
        """Run the job in this task; tasks of rank > 0 share rank 0's job directory without
        rewriting its ``.hydra`` files, and log to ``rank<N>.log``."""
        rank = int(os.environ.get("SLURM_PROCID", "0") or 0)
        if rank > 0:
            sweep_overrides = [*sweep_overrides, "hydra.output_subdir=null", f"hydra.job.name=rank{rank}"]
        return super().__call__(sweep_overrides, job_dir_key, job_num, job_id, singleton_state)


class DryRunExecutor:
    """Stands in for submitit's executor: writes the sbatch script of each array, submits nothing."""

    def __init__(self, out_dir: Path, submitit_folder: str) -> None:
        self.out_dir = out_dir
        self.submitit_folder = submitit_folder
        self.parameters: dict[str, Any] = {}

    def update_parameters(self, **params: Any) -> None:
        self.parameters = dict(params)

    def sbatch_script(self, array_size: int) -> str:
        """The script submitit would give ``sbatch`` for these parameters (submitit's own writer)."""
        from submitit.slurm.slurm import SlurmExecutor, _convert_mem, _make_sbatch_string

        rename = SlurmExecutor._equivalence_dict()
        native: dict[str, Any] = {}
        for key, value in self.parameters.items():
            if value is None:
                continue
            key = key.removeprefix("slurm_") if key.startswith("slurm_") else rename.get(key, key)
            native[key] = _convert_mem(value) if key == "mem" else value
        command = f"{shlex.quote(sys.executable)} -u -m submitit.core._submit {shlex.quote(self.submitit_folder)}"
        return _make_sbatch_string(command=command, folder=self.submitit_folder,
                                   map_count=array_size if array_size > 1 else None, **native)

    def map_array(self, fn: Any, overrides: Sequence[list[str]], job_dir_keys: Sequence[str],
                  job_nums: Sequence[int], *_: Any) -> list["_DryRunJob"]:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        script = self.out_dir / f"array_{job_nums[0]}.sbatch"
        script.write_text(self.sbatch_script(len(job_nums)))
        index = self.out_dir / "jobs.json"
        jobs = json.loads(index.read_text()) if index.exists() else {}
        for num, job_overrides in zip(job_nums, overrides):
            jobs[str(num)] = {"overrides": list(job_overrides), "sbatch": script.name, "parameters": self.parameters}
            log.info(f"\t#{num} would be submitted with {script}")
        index.write_text(json.dumps(jobs, indent=2, sort_keys=True, default=str))
        return [_DryRunJob(list(o), str(self.out_dir)) for o in overrides]


class _DryRunJob(NamedTuple):
    overrides: list[str]
    working_dir: str

    def results(self) -> list[JobReturn]:
        return [JobReturn(overrides=self.overrides, working_dir=self.working_dir, task_name="drivebench",
                          status=JobStatus.COMPLETED, _return_value=None)]
