"""The built wheel is all of drivebench: installed into a fresh virtual environment outside the checkout,
its ``drivebench`` command trains a tiny run and reports it from a temporary directory.

Fast by construction: the wheel is built without build isolation from a copy of the sources, and the
new environment reaches the already installed dependencies through a ``.pth`` file (the wheel itself
is installed with ``--no-deps``). That ``.pth`` adds the dependencies' folder only; Python does not
read the ``.pth`` files inside it, so the checkout's editable install stays out of the new environment:
``import drivebench`` there finds the wheel's copy (checked below).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TINY = ["model=qcnet", "model.size=tiny", "data.size=mini", "accel=none", "ckpt=none", "trainer.max_steps=3",
        "bench.warmup_steps=1", "bench.val_batches=0", "bench.ceiling=false"]


def _run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 300):
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{cmd}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv holding the wheel of this checkout; returns its bin/ folder."""
    root = tmp_path_factory.mktemp("wheel")
    clean = _env(root)  # no PYTHONPATH: pip must not see the checkout as an installed drivebench
    src = root / "src"
    src.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in ("drivebench", "hydra_plugins"):
        shutil.copytree(REPO / name, src / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    dist = root / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist), str(src)],
         cwd=root, env=clean)
    wheel = next(dist.glob("drivebench-*.whl"))
    env_dir = root / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], cwd=root, env=clean)
    python = env_dir / "bin" / "python"
    # installed before the dependencies are reachable: pip then sees no other drivebench to replace
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)], cwd=root,
         env=clean)
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=root,
                     env=clean).stdout.strip())
    (site / "_drivebench_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return env_dir / "bin"


def _env(cache: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return {**env, "DRIVEBENCH_CACHE": str(cache), "OMP_NUM_THREADS": "1"}


def test_the_wheel_holds_the_configs_and_is_what_runs(venv: Path, tmp_path: Path):
    code = "import drivebench, drivebench.conf, pathlib; print(drivebench.__file__)"
    where = Path(_run([str(venv / "python"), "-c", code], cwd=tmp_path, env=_env(tmp_path)).stdout.strip())
    assert where.is_relative_to(venv.parent) and not where.is_relative_to(REPO), where
    conf = where.parent / "conf"
    shipped = {p.relative_to(conf).as_posix() for p in conf.rglob("*.yaml")}
    in_checkout = {p.relative_to(REPO / "drivebench" / "conf").as_posix()
                   for p in (REPO / "drivebench" / "conf").rglob("*.yaml")}
    assert shipped == in_checkout and "experiment/smoke.yaml" in shipped


def test_drivebench_trains_and_reports_from_a_temporary_directory(venv: Path, tmp_path: Path, drivebench_cache: Path):
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = _env(drivebench_cache)
    proc = _run([str(venv / "drivebench"), *TINY, "hydra.run.dir=run"], cwd=work, env=env, timeout=600)
    assert "drivebench run summary" in proc.stdout
    summary = json.loads((work / "run" / "summary.json").read_text())
    assert summary["run"]["status"] == "completed" and summary["train"]["steps_measured"] == 2
    assert summary["run"]["command"].split()[0].endswith("drivebench")
    _run([str(venv / "drivebench"), "report", "run", "report.out=report", "report.target=train/loss<=1e9"],
         cwd=work, env=env)
    report = (work / "report" / "report.csv").read_text()
    assert "qcnet" in report and (work / "report" / "report.md").is_file()
    # the same subcommand through `python -m` of the installed package
    _run([str(venv / "python"), "-m", "drivebench.report", "run", "--out", "report2"], cwd=work, env=env)
    assert (work / "report2" / "report.csv").is_file()


def test_a_bad_override_of_the_installed_command(venv: Path, tmp_path: Path):
    proc = subprocess.run([str(venv / "drivebench"), "accel.num_worker=4"], cwd=tmp_path, env=_env(tmp_path),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("drivebench: error: accel.num_worker=4 is not a key of accel")
