"""Bad config values (issue 21, 4): every one is refused before any work, in one line naming the key and
the fix, with exit code 2 (``drivebench: error: <key>=<value> ...``).

Before: Hydra's composition errors printed several lines with exit 1; twenty values printed a traceback
(some after training: ``bench.val_batches=-1``, ``trainer.accumulate_grad_batches=0`` mid-fit); eight
were accepted and then wrong (``bench.max_minutes=-1`` trained 0 steps with exit 0, ``dist.devices=3`` with
``dist=single`` ran a 3-rank DDP labelled single, ``ckpt.keep_last_k=1.5`` crashed at the second save).

The 70 values below are checked by the ``drivebench`` command itself (``drivebench.__main__.main``), in
this process: composition and the schemas (drivebench/schemas.py), then the run's own pre-work checks
(``drivebench.app.check_before_start``), before Hydra starts the job. Hydra's job is replaced by one that
fails the test, so a value that got through would be reported, not trained on. A few go through a real
``python -m drivebench`` to show the exit code, the single line and that nothing was made.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# (overrides, the start of the message after "drivebench: error: ", a word of the fix); "{tmp}" is the
# test's directory, holding a_file (a plain file), empty.ckpt and garbage.ckpt
BAD_VALUES = [
    # Hydra's composition: a group option or a key that does not exist
    ("model=nosuch", "model='nosuch' is not valid", "choose one of: gaussianformer, maptr"),
    ("accel=nosuch", "accel='nosuch' is not valid", "choose one of: auto, cpu"),
    ("bench=nosuch", "bench='nosuch' is not valid", "choose one of: autotune"),
    ("machine=nosuch", "machine='nosuch' is not valid", "a100, h200, local"),
    ("ckpt=nosuch", "ckpt='nosuch' is not valid", "async, local, none, remote"),
    ("dist=nosuch", "dist='nosuch' is not valid", "ddp, single"),
    ("data=nosuch", "data='nosuch' is not valid", "argoverse2, mmdet3d, nuscenes"),
    ("trainer=nosuch", "trainer='nosuch' is not valid", "default, full"),
    ("callbacks=nosuch", "callbacks='nosuch' is not valid", "default, lr_monitor"),
    ("logger=nosuch", "logger='nosuch' is not valid", "tensorboard"),
    ("accel.num_worker=4", "accel.num_worker=4 is not a key of accel", "valid keys: "),
    ("+accel.num_worker=4", "accel.num_worker=4 is not a key of accel", "num_workers"),
    # types
    ("bench.val_batches=abc", "bench.val_batches='abc' is not valid", "'all'"),
    ("ckpt.every_n_steps=abc", "ckpt.every_n_steps='abc' is not valid", "whole number"),
    ("ckpt.keep_last_k=abc", "ckpt.keep_last_k='abc' is not valid", "whole number"),
    ("ckpt.every_n_minutes=abc", "ckpt.every_n_minutes='abc' is not valid", "number"),
    ("trainer.max_epochs=abc", "trainer.max_epochs='abc' is not valid", "whole number"),
    ("ckpt.keep_last_k=1.5", "ckpt.keep_last_k=1.5 is not valid", "whole number"),
    ("ckpt.every_n_steps=1.5", "ckpt.every_n_steps=1.5 is not valid", "whole number"),
    ("seed=abc", "seed='abc' is not valid", "whole number"),
    ("dist.devices=abc", "dist.devices='abc' is not valid", "or auto"),
    ("bench.ceiling_steps=abc", "bench.ceiling_steps='abc' is not valid", "'auto'"),
    # booleans
    ("ckpt.save_last=maybe", "ckpt.save_last='maybe' is not valid", "true or false"),
    ("bench.ceiling=maybe", "bench.ceiling='maybe' is not valid", "true or false"),
    ("ckpt.async_write=maybe", "ckpt.async_write='maybe' is not valid", "true or false"),
    ("bench.sync_each_step=maybe", "bench.sync_each_step='maybe' is not valid", "true or false"),
    ("requeue=maybe", "requeue='maybe' is not valid", "true or false"),
    ("accel.compile=maybe", "accel.compile='maybe' is not valid", "true, false or 'auto'"),
    ("accel.tf32=maybe", "accel.tf32='maybe' is not valid", "true, false or 'auto'"),
    ("trainer.deterministic=maybe", "trainer.deterministic='maybe' is not valid", "true, false, warn"),
    ("dist=ddp dist.find_unused_parameters=maybe", "dist.find_unused_parameters='maybe' is not valid", "true or false"),
    # ranges
    ("bench.val_batches=-1", "bench.val_batches=-1 is not valid", ">= 0"),
    ("bench.steps=-1", "bench.steps=-1 is not valid", ">= 0"),
    ("bench.warmup_steps=-2", "bench.warmup_steps=-2 is not valid", ">= 0"),
    ("bench.ceiling_warmup_steps=-1", "bench.ceiling_warmup_steps=-1 is not valid", ">= 0"),
    ("bench.loader_batches=-1", "bench.loader_batches=-1 is not valid", ">= 0"),
    ("bench.max_minutes=-1", "bench.max_minutes=-1.0 is not valid", "> 0 or null"),
    ("bench.profile=-1", "bench.profile=-1 is not valid", "0/null (off)"),
    ("trainer.log_every_n_steps=0", "trainer.log_every_n_steps=0 is not valid", ">= 1"),
    ("trainer.max_steps=-5", "trainer.max_steps=-5 is not valid", ">= -1"),
    ("trainer.max_epochs=-2", "trainer.max_epochs=-2 is not valid", ">= -1"),
    ("trainer.accumulate_grad_batches=0", "trainer.accumulate_grad_batches=0 is not valid", ">= 1"),
    ("trainer.gradient_clip_val=-1", "trainer.gradient_clip_val=-1.0 is not valid", ">= 0"),
    ("trainer.val_check_interval=-1", "trainer.val_check_interval=-1 is not valid", "fraction of the epoch"),
    ("trainer.check_val_every_n_epoch=0", "trainer.check_val_every_n_epoch=0 is not valid", ">= 1"),
    ("ckpt.keep_last_k=-1", "ckpt.keep_last_k=-1 is not valid", ">= 0"),
    ("ckpt.every_n_steps=0", "ckpt.every_n_steps=0 is not valid", ">= 1"),
    ("ckpt.every_n_minutes=-5", "ckpt.every_n_minutes=-5.0 is not valid", "> 0"),
    ("dist.num_nodes=0", "dist.num_nodes=0 is not valid", ">= 1"),
    ("dist.devices=0", "dist.devices=0 is not valid", ">= 1 or auto"),
    ("dist=ddp dist.timeout_minutes=0", "dist.timeout_minutes=0.0 is not valid", "> 0"),
    ("seed=-1", "seed=-1 is not valid", "[0, 2**32 - 1]"),
    ("model.optimizer.lr=-0.001", "model.optimizer.lr=-0.001 is not valid", ">= 0"),
    ("model.batch_size=0", "model.batch_size=0 is not valid", ">= 1"),
    ("model.val_batch_size=-1", "model.val_batch_size=-1 is not valid", ">= 1"),
    ("model.module.bucket_growth=0.9", "model.module.bucket_growth=0.9 is not valid", "factor >= 1"),
    ("model.module.max_buckets=0", "model.module.max_buckets=0 is not valid", "whole number >= 1"),
    ("model=maptr data.image_size=[0,0]", "data.image_size=[0, 0] is not valid", "[width, height]"),
    ("machine.gpus_per_node=-1", "machine.gpus_per_node=-1 is not valid", ">= 1 or null"),
    ("accel.num_workers=-1", "accel.num_workers=-1 is not valid", ">= 0 or 'auto'"),
    ("accel.prefetch_factor=0", "accel.prefetch_factor=0 is not valid", ">= 1 or null"),
    ("accel.threads=-2", "accel.threads=-2 is not valid", "auto, default or a whole number"),
    ("model=gaussianformer model.net.norm_eval=maybe", "model.net.norm_eval='maybe' is not valid", "with_weights"),
    # a net argument the model's constructor refuses (run on the meta device before any work)
    ("model.net.compile_scope=all", "model.net.compile_scope='all' is not valid", "layers_gru"),
    ("model=sparsedrive model.net.aggregation=nosuch", "model.net.aggregation='nosuch' is not valid", "grid_sample"),
    ("model=sparsedrive model.net.compile_scope=all", "model.net.compile_scope='all' is not valid", "encoder, aggregation, anchors, heads"),
    # choices
    ("machine.accelerator=tpu", "machine.accelerator='tpu' is not valid", "auto, gpu, cpu"),
    ("model.size=nosuch", "model.size='nosuch' is not a size of model 'qcnet'", "paper, test"),
    ("data.size=nosuch", "data.size='nosuch' is not valid", "mini, bench"),
    ("model=maptr data.on_corrupt=maybe", "data.on_corrupt='maybe' is not valid", "fail, skip"),
    ("accel.precision=fp7", "accel.precision='fp7' is not valid", "32-true"),
    ("dist=ddp dist.backend=nosuch", "dist.backend='nosuch' is not valid", "nccl, gloo, mpi"),
    ("dist=ddp dist.p2p=nosuch", "dist.p2p='nosuch' is not valid", "auto, on, off"),
    ("bench.targets=[nonsense]", "bench.targets='nonsense' is not valid", "METRIC<=VALUE"),
    # combinations
    ("dist.devices=3", "dist.devices=3 with dist=single is not valid", "dist=ddp dist.devices=3"),
    ("data=nuscenes model=qcnet", "data=nuscenes with model=qcnet is not valid", "data=argoverse2"),
    ("requeue=true", "requeue=true restarts this command", "resume=auto"),
    # paths and files
    ("hydra.run.dir={tmp}/a_file", "hydra.run.dir={tmp}/a_file names a file", "choose another hydra.run.dir"),
    ("paths.cache={tmp}/a_file", "paths.cache={tmp}/a_file names a file", "directory"),
    ("ckpt.dir={tmp}/a_file/sub", "ckpt.dir={tmp}/a_file/sub is inside {tmp}/a_file, a file", "directory"),
    # a folder that cannot be made there (root writes anywhere by its permission bits, not in /proc)
    ("ckpt=local ckpt.dir=/proc/drivebench-x", "ckpt.dir=/proc/drivebench-x cannot be made in /proc",
     "choose a writable"),
    ("resume={tmp}/garbage.ckpt", "resume={tmp}/garbage.ckpt is not a checkpoint drivebench can read", "not a zip"),
    ("resume={tmp}/empty.ckpt", "resume={tmp}/empty.ckpt is not a checkpoint drivebench can read", "empty"),
    ("resume={tmp}/nosuch.ckpt", "resume={tmp}/nosuch.ckpt does not exist", "resume=auto"),
    ("model=maptr model.net.backbone_weights={tmp}/nosuch.pth", "model.net.backbone_weights={tmp}/nosuch.pth does not exist",
     "model.net.backbone_weights=null"),
    ("model=maptr model.net.backbone_weights={tmp}/garbage.ckpt",
     "model.net.backbone_weights={tmp}/garbage.ckpt is not a state_dict torch.load can read", "ResNet state_dict"),
]


def _files(where: Path) -> None:
    (where / "a_file").write_text("not a directory")
    (where / "garbage.ckpt").write_bytes(b"\x80\x04not a checkpoint" * 100)
    (where / "empty.ckpt").write_bytes(b"")


@pytest.fixture
def no_job(monkeypatch):
    """Hydra's job, replaced: a value the checks let through fails the test instead of training."""
    import drivebench.__main__ as entry

    def got_through() -> None:
        raise AssertionError("the checks let this command line through to Hydra's job")

    monkeypatch.setattr(entry, "_main", got_through)
    return entry.main


@pytest.mark.parametrize("overrides, message, fix", BAD_VALUES, ids=[case[0] for case in BAD_VALUES])
def test_a_bad_value_is_refused_before_any_work_in_one_line(overrides, message, fix, tmp_path, monkeypatch, capsys,
                                                            no_job):
    work = tmp_path / "cwd"
    work.mkdir()
    _files(tmp_path)
    monkeypatch.chdir(work)
    monkeypatch.setenv("DRIVEBENCH_CACHE", str(tmp_path / "cache"))
    with pytest.raises(SystemExit) as stop:
        no_job(overrides.format(tmp=tmp_path).split())
    err = capsys.readouterr().err
    assert stop.value.code == 2, err
    assert err.startswith(f"drivebench: error: {message.format(tmp=tmp_path)}"), err
    assert fix.format(tmp=tmp_path) in err and len(err.strip().splitlines()) == 1, err
    assert not list(work.iterdir()) and not (tmp_path / "cache").exists(), "something was made"


def test_the_list_holds_seventy_values_and_every_group():
    assert len(BAD_VALUES) >= 70 and len({case[0] for case in BAD_VALUES}) == len(BAD_VALUES)
    keys = {word.lstrip("+").split("=")[0].split(".")[0] for case in BAD_VALUES for word in case[0].split()}
    groups = sorted(p.name for p in (REPO / "drivebench" / "conf").iterdir() if p.is_dir()
                    and p.name not in ("hydra", "__pycache__", "experiment", "accel_step"))
    assert set(groups) <= keys, sorted(set(groups) - keys)


def test_every_model_names_the_data_it_reads():
    """``model.data_family`` (what the combination check compares) is the data its own config selects."""
    from drivebench.compose import compose

    for model in sorted(p.stem for p in (REPO / "drivebench" / "conf" / "model").glob("*.yaml")):
        cfg = compose([f"model={model}"])
        assert cfg.model.data_family == cfg.data.name, model


@pytest.mark.parametrize("overrides", [
    ["trainer.accumulate_grad_batches=0"],   # was a ZeroDivisionError mid-fit
    ["data=nuscenes", "model=qcnet"],        # was an AttributeError after data preparation
    ["bench.val_batches=-1"],                # was a traceback after training, no summary
], ids=lambda o: " ".join(o))
def test_the_command_exits_2_with_one_line_and_makes_nothing(overrides, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "DRIVEBENCH_CACHE": str(tmp_path / "cache")}
    work = tmp_path / "cwd"
    work.mkdir()
    proc = subprocess.run([sys.executable, "-m", "drivebench", *overrides], cwd=work, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"drivebench: error: {overrides[0].split('=')[0]}"), proc.stderr
    assert proc.stdout == "" and not list(work.iterdir()) and not (tmp_path / "cache").exists()
