"""The README's "Using it" block, run as written on the CPU: every ``python -m drivebench ...`` line of
it, at its CPU defaults, with a bounded step count appended, so the README cannot go stale.

What the test appends (``BOUNDS``, by the bench the command runs; the same keys a user would type):
``bench.warmup_steps=1 bench.steps=2 trainer.max_steps=3`` (``trainer.max_steps`` also bounds the
epoch schedule of ``+experiment=convergence``), one validation batch, one ceiling step after one warm-up
step, two loader batches for ``bench=loader``, a 1 MB checkpoint written once per folder for
``bench=storage``, and a one-step trial per candidate within 20 s for ``accel=auto``. A multirun's
jobs neither validate nor measure the ceiling (the single runs do), except the convergence sweep,
whose targets need its validation. Placeholders
become real values: ``ckpt.dir=/mnt/a,/mnt/b`` two temporary folders, ``model.config=<name|path>`` the
default config of conf/model/mmdet3d.yaml. Lines that are not ``python -m drivebench`` (the installed
``drivebench`` command, ``torchrun``, ``make``) are the same entry point and are left to their own tests.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from conftest import REPO, run_cli

from drivebench.start_method import has_fork_deadlock

PREFIX = "python -m drivebench "
TRAIN_BOUNDS = ["bench.warmup_steps=1", "bench.steps=2", "trainer.max_steps=3", "bench.val_batches=1",
                "bench.ceiling_warmup_steps=1", "bench.ceiling_steps=1"]
BOUNDS = {
    "train": TRAIN_BOUNDS,
    "ceiling": TRAIN_BOUNDS,
    "loader": [*TRAIN_BOUNDS, "bench.loader_batches=2"],
    "mmengine": TRAIN_BOUNDS,
    "storage": ["bench.size_mb=1", "bench.repeats=1"],
}
SWEEP_BOUNDS = ["bench.val_batches=0", "bench.ceiling=false"]
AUTO_BOUNDS = ["accel.auto_steps=1", "accel.auto_warmup_steps=1", "accel.auto_budget_s=20"]
# Lightning's console noise that a default run must not show (issue 23)
NOT_ON_THE_CONSOLE = ("/-2 ", "but have no `val_dataloader`", "but have passed in a `LightningDataModule`",
                      "Traceback")


def using_it_commands() -> list[str]:
    """The ``python -m drivebench`` lines of the first code block under "## Using it" (comments cut)."""
    text = (REPO / "README.md").read_text()
    section = text.split("\n## Using it\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"^```\n(.*?)^```", section, re.S | re.M)
    assert block, "README.md: no code block under '## Using it'"
    lines = [line.split("  #", 1)[0].strip() for line in block.group(1).splitlines()]
    return [line for line in lines if line.startswith(PREFIX)]


COMMANDS = using_it_commands()


def _value(words: list[str], key: str, default: str) -> str:
    found = [w.split("=", 1)[1] for w in words if w.split("=", 1)[0].lstrip("+") == key]
    return found[-1] if found else default


def bounded(command: str, tmp: Path) -> list[str]:
    """The command's words after ``python -m drivebench``, placeholders filled, bounds appended."""
    words = shlex.split(command[len(PREFIX):])
    out = []
    for word in words:
        key, _, value = word.partition("=")
        if key == "ckpt.dir" and value.startswith("/mnt/"):
            dirs = [tmp / f"ckpt{i}" for i, _ in enumerate(value.split(","))]
            word = f"ckpt.dir={','.join(map(str, dirs))}"
        elif key == "model.config" and value.startswith("<"):
            word = "model.config=pointpillars_hv_fpn_sbn-all_8xb4-2x_nus-3d"
        out.append(word)
    bench = _value(out, "bench", "train")
    out += BOUNDS[bench]
    if out[0] == "-m" and not _value(out, "bench.targets", "") and "+experiment=convergence" not in out:
        out += SWEEP_BOUNDS  # the single runs above validate and measure the ceiling
    if _value(out, "accel", "") == "auto":
        out += AUTO_BOUNDS
    return [*out, f"hydra.run.dir={tmp / 'run'}", f"hydra.sweep.dir={tmp / 'sweep'}"]


def test_the_block_is_found_and_holds_the_commands_it_should() -> None:
    assert len(COMMANDS) >= 10, COMMANDS
    assert any(" -m " in c[len(PREFIX) - 1:] for c in COMMANDS), "the multirun examples"
    assert any("bench=ceiling model=sparsedrive" in c for c in COMMANDS)


def _params():
    for command in COMMANDS:
        marks = [pytest.mark.openmmlab] if "model=mmdet3d" in command else []
        yield pytest.param(command, marks=marks, id=command[len(PREFIX):].split("  ")[0])


@pytest.mark.parametrize("command", _params())
def test_a_readme_command_runs_on_the_cpu_at_its_defaults(command: str, tmp_path: Path, drivebench_cache: Path,
                                                          request: pytest.FixtureRequest) -> None:
    if "model=mmdet3d" in command:
        request.getfixturevalue("openmmlab_stack")
    args = bounded(command, tmp_path)
    result = run_cli(args, drivebench_cache, cwd=tmp_path, env={"DRIVEBENCH_FORCE_CPU": "1"})
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"{' '.join(args)}\n{output[-4000:]}"
    summaries = sorted(tmp_path.glob("run/summary.json")) + sorted(tmp_path.glob("sweep/*/summary.json"))
    assert summaries, f"no summary.json written\n{output[-2000:]}"
    if args[0] == "-m":
        jobs = [p for p in (tmp_path / "sweep").iterdir() if p.is_dir() and (p / ".hydra").is_dir()]
        assert len(summaries) == len(jobs) >= 2, (sorted(p.name for p in jobs), summaries)
    for noise in NOT_ON_THE_CONSOLE:
        assert noise not in output, f"{noise!r} on the console of {command}"
    if "dist=ddp" in args:  # gloo ranks: workers fork only where the interpreter cannot deadlock them
        summary = json.loads(summaries[0].read_text())
        assert summary["settings"]["accel"]["num_workers"] > 0, "the README's DDP command no longer has loader workers"
        assert summary["data"]["worker_start_method"] == ("forkserver" if has_fork_deadlock() else "fork")
    if "resume=auto" in command:  # nothing under paths.outputs_root (./outputs here) to resume: it says so
        run = json.loads(summaries[0].read_text())["run"]
        assert run["resumed_from"] is None
        line = next(line for line in result.stdout.splitlines() if line.startswith("resumed from"))
        assert "no checkpoint of qcnet/" in line and "started fresh" in line
