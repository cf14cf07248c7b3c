"""resume=auto finds an earlier run made with the default model and data sizes: its saved
``.hydra/config.yaml`` holds ``size: ${on_gpu:paper,test}`` unresolved, so earlier runs must be
matched on the values they resolved; the summary table then says that, and from where, it resumed."""

from __future__ import annotations

from pathlib import Path

import yaml

from test_ckpt_cli_helpers import run_cli, shared_cache, summary

# QCNet at its default size and data size: no model.size / data.size given (the CPU test size on the mini set here)
DEFAULT_SIZES = ["model=qcnet", "accel=none", "bench.ceiling=false", "bench.val_batches=0", "bench.warmup_steps=0",
                 "trainer.log_every_n_steps=1", "ckpt.every_n_steps=2"]


def test_resume_auto_finds_a_run_made_with_the_default_sizes(tmp_path_factory):
    cache = shared_cache(tmp_path_factory)
    outputs = tmp_path_factory.mktemp("default-sizes") / "outputs"
    first, second = outputs / "first", outputs / "second"
    first.mkdir(parents=True)
    args = [*DEFAULT_SIZES, f"paths.outputs_root={outputs}"]
    done = run_cli([*args, f"hydra.run.dir={first}", "bench.steps=4"], cache, cwd=outputs)
    assert done.returncode == 0, done.stderr[-3000:]
    written = yaml.safe_load((first / ".hydra" / "config.yaml").read_text())
    assert "${on_gpu:" in written["model"]["size"], "the saved config no longer holds the default size unresolved"
    assert summary(first)["run"]["resume"] is None and "resumed from" not in done.stdout

    resumed = run_cli([*args, f"hydra.run.dir={second}", "bench.steps=6", "resume=auto"], cache, cwd=outputs)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    record = summary(second)["run"]
    expected = str(next((first / "checkpoints").glob("step-00000004-*.ckpt")))  # named after its run
    assert record["resumed_from"] == expected
    assert record["resume"]["step"] == 4 and f"earlier qcnet/{record['model_size']}/argoverse2 run" in record["resume"]["how"]
    table_line = next(line for line in resumed.stdout.splitlines() if line.startswith("resumed from"))
    assert expected in table_line and "step 4" in table_line and str(first) in table_line


# resume=auto with nothing to resume ("resumed from  no checkpoint of qcnet/... started fresh"): the README's
# `python -m drivebench model=qcnet ckpt=async ckpt.every_n_steps=100 resume=auto`, run by tests/test_readme.py
