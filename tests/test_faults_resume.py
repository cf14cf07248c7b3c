"""Resume identity (issue 21, 3): ``resume=auto`` continues only this run's own training; anything else is
``resume=<path>``, explicit, and the run says what it resumed from and which values differ.

Before: with no complete checkpoint in ``ckpt.dir``, ``resume=auto`` took the newest checkpoint under
``outputs/`` of the same model, size and data, whatever its other values (gradient clipping...), silently;
``resume=<garbage>`` failed after data preparation with advice to unpickle unsafely, ``resume=<empty>`` with
``EOFError:``; the disk-full advice ("point ckpt.dir elsewhere, then continue with resume=auto") led to a
fresh start.
"""

from __future__ import annotations

import resource
import signal
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

from drivebench.ckpt.identity import RunIdentity, differences, training_values
from drivebench.ckpt.resume import resolve_resume
from drivebench.ckpt.store import parse_name
from drivebench.errors import ConfigError
from test_ckpt_cli_helpers import (TRAIN, losses, run_cli, shared_cache, start_training, step_file, summary,
                                   wait_for_step)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return shared_cache(tmp_path_factory)


# ---- the fingerprint ----------------------------------------------------------------------------------------
def config(**over):
    base = {"model": {"name": "qcnet", "size": "test", "batch_size": 4, "val_batch_size": 4,
                      "optimizer": {"lr": 5e-4}}, "data": {"name": "argoverse2", "size": "mini",
                                                            "source": {"cache_dir": "/a/cache"}},
            "seed": 2023, "trainer": {"max_steps": 10, "gradient_clip_val": None, "accumulate_grad_batches": 1},
            "bench": {"steps": 30, "warmup_steps": 10}, "accel": {"precision": "32-true", "compile": False}}
    for key, value in over.items():
        node = base
        *parents, leaf = key.split(".")
        for p in parents:
            node = node[p]
        node[leaf] = value
    return base


@pytest.mark.parametrize("key, value", [
    ("model.optimizer.lr", 1e-3), ("model.batch_size", 8), ("model.size", "paper"), ("data.size", "bench"),
    ("seed", 1), ("trainer.gradient_clip_val", 1.0), ("trainer.accumulate_grad_batches", 2),
    ("accel.precision", "bf16-mixed")])
def test_every_value_that_changes_a_step_changes_the_fingerprint(key, value):
    mine, theirs = RunIdentity.of_config(config(), 1), RunIdentity.of_config(config(**{key: value}), 1)
    assert mine.fingerprint != theirs.fingerprint
    assert [line.split(":")[0] for line in differences(theirs.values, mine.values)] == [key]


@pytest.mark.parametrize("key, value", [
    ("trainer.max_steps", 100), ("bench.steps", 4), ("bench.warmup_steps", 0), ("accel.compile", True),
    ("model.val_batch_size", 16), ("data.source.cache_dir", "/elsewhere")])
def test_the_budget_and_speed_knobs_are_not_part_of_it(key, value):
    assert RunIdentity.of_config(config(), 1).fingerprint == RunIdentity.of_config(config(**{key: value}), 1).fingerprint


def test_the_number_of_processes_is_part_of_it():
    assert RunIdentity.of_config(config(), 1).fingerprint != RunIdentity.of_config(config(), 2).fingerprint
    assert training_values(config(), 2)["world_size"] == 2


# ---- resume=<path> that cannot be read: one line, before any work --------------------------------------------
def test_unreadable_resume_files_are_named_in_one_line(tmp_path):
    me = RunIdentity.of_config(config(), 1)
    garbage = tmp_path / "garbage.ckpt"
    garbage.write_bytes(b"\x80\x04not a checkpoint at all" * 100)
    empty = tmp_path / "empty.ckpt"
    empty.write_bytes(b"")
    not_training = tmp_path / "weights.pt"
    torch.save({"w": torch.zeros(3)}, not_training)
    unsafe = tmp_path / "unsafe.ckpt"
    torch.save({"state_dict": {}, "global_step": 1, "obj": Path("x")}, unsafe)
    torn = tmp_path / "torn.ckpt"
    torn.write_bytes(not_training.read_bytes()[:-40])  # a zip without its central directory
    cases = {garbage: "not a zip archive", empty: "the file is empty", not_training: "not a training checkpoint",
             unsafe: "refuses", torn: "zip archive"}
    for path, why in cases.items():
        with pytest.raises(ConfigError) as err:
            resolve_resume(OmegaConf.create({"resume": str(path)}), None, me)
        message = str(err.value)
        assert message.startswith(f"resume={path} ") and why in message and "\n" not in message, message
        assert "weights_only=False" not in message and "trust" not in message  # no advice to unpickle unsafely


def test_resume_garbage_exits_2_before_any_work(tmp_path, cache):
    garbage = tmp_path / "garbage.ckpt"
    garbage.write_bytes(b"PK\x03\x04 a torn zip")
    run_dir = tmp_path / "run"
    done = run_cli([*TRAIN, f"hydra.run.dir={run_dir}", "bench.steps=2", f"resume={garbage}"], cache, cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-3000:]
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("drivebench:")]
    assert line.startswith(f"drivebench: error: resume={garbage} is not a checkpoint drivebench can read")
    assert "Traceback" not in done.stderr and not (run_dir / "tb").exists()
    assert "preprocess" not in done.stderr  # refused before data preparation


# ---- one run of other training, stopped by a failed write: the checkpoints the resume tests share -------------
def _ignore_sigxfsz() -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


@pytest.fixture(scope="module")
def failed_run(tmp_path_factory, cache) -> SimpleNamespace:
    """A run under ``outputs/`` of other training than the default (gradient clipping 1.0), checkpointing every
    3 steps, whose second save fails (a file-size limit set after its first: EFBIG). Its step-3 checkpoint is
    what the tests below continue, pass over, or are told to continue."""
    root = tmp_path_factory.mktemp("resume")
    outputs = root / "outputs"
    ckpt_dir = outputs / "failed" / "checkpoints"
    proc = start_training(outputs / "failed", cache, "trainer.gradient_clip_val=1.0", f"ckpt.dir={ckpt_dir}",
                          "ckpt.every_n_steps=3", f"paths.outputs_root={outputs}", steps=100,
                          preexec_fn=_ignore_sigxfsz)
    first = wait_for_step(ckpt_dir, 3, proc)
    resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (first.stat().st_size // 2, resource.RLIM_INFINITY))
    _, err = proc.communicate(timeout=300)
    return SimpleNamespace(root=root, outputs=outputs, ckpt_dir=ckpt_dir, first=first, returncode=proc.returncode,
                           stderr=err)


def side_by_side(cache: Path, *runs: tuple[Path, list[str], int]) -> list[subprocess.CompletedProcess]:
    """Training runs ``(run_dir, overrides, steps)`` at once (two cores, one thread each); each must succeed."""
    procs = [start_training(run_dir, cache, *extra, steps=steps) for run_dir, extra, steps in runs]
    done = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, f"{' '.join(proc.args)} failed:\n{out[-2000:]}\n{err[-3000:]}"
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return done


# ---- resume=auto: only its own training; resume=<path>: explicit, with the differences --------------------------
def test_resume_auto_passes_over_other_training_and_an_explicit_path_says_what_differs(failed_run, cache):
    outputs, theirs = failed_run.outputs, failed_run.first
    fresh = outputs / "fresh"  # nothing of its own training anywhere under outputs/: starts fresh, and says so
    explicit = failed_run.root / "explicit"  # outside outputs/: fresh's resume=auto must not see it, running beside
    fresh_done, explicit_done = side_by_side(
        cache, (fresh, ["ckpt.every_n_steps=3", "resume=auto", f"paths.outputs_root={outputs}"], 2),
        (explicit, ["ckpt.every_n_steps=3", f"resume={theirs}"], 6))

    record = summary(fresh)["run"]
    assert record["resumed_from"] is None and sorted(losses(fresh)) == [0, 1]
    assert "no checkpoint of qcnet/test/argoverse2 with this run's training" in fresh_done.stdout + fresh_done.stderr

    record = summary(explicit)["run"]
    assert record["resumed_from"] == str(theirs) and sorted(losses(explicit)) == [3, 4, 5]
    assert record["resume"]["differs"] == ["trainer.gradient_clip_val: 1.0 -> null"]
    assert "bench.steps: 100 -> 6" in record["resume"]["also_differs"]
    printed = [line for line in (explicit_done.stdout + explicit_done.stderr).splitlines()
               if "trainer.gradient_clip_val: 1.0 -> null" in line]
    assert printed and f"resume={theirs}" in printed[0]
    assert record["run_id"] != parse_name(theirs.name)[2]  # other training: a run of its own
    assert parse_name(step_file(explicit / "checkpoints", 6).name)[2] == record["run_id"]
    assert not [p for p in failed_run.ckpt_dir.iterdir() if record["run_id"] in p.name]  # theirs untouched


def test_the_failed_write_advice_is_true(failed_run, cache):
    """A save fails (file-size limit, EFBIG); the message names the checkpoint to continue and two ways:
    the same ckpt.dir with resume=auto, or another ckpt.dir with resume=<that checkpoint>. Both work."""
    first, ckpt_dir = failed_run.first, failed_run.ckpt_dir
    assert failed_run.returncode == 1
    (line,) = [x for x in failed_run.stderr.splitlines() if x.startswith("drivebench: error:")]
    assert f"resume={first}" in line and "resume=auto and the same ckpt.dir" in line, line

    same = ["trainer.gradient_clip_val=1.0", "ckpt.every_n_steps=3"]  # the failed run's training
    elsewhere, moved, again = failed_run.root / "elsewhere", failed_run.root / "moved", failed_run.root / "again"
    side_by_side(cache, (moved, [*same, f"ckpt.dir={elsewhere}", f"resume={first}"], 6),
                 (again, [*same, f"ckpt.dir={ckpt_dir}", "resume=auto"], 6))
    record = summary(moved)["run"]
    assert record["resumed_from"] == str(first) and sorted(losses(moved)) == [3, 4, 5]
    assert step_file(elsewhere, 6).name == first.name.replace("00000003", "00000006")  # the same run, continued
    record = summary(again)["run"]
    assert record["resumed_from"] == str(first) and sorted(losses(again)) == [3, 4, 5]
    assert step_file(ckpt_dir, 6).name == first.name.replace("00000003", "00000006")


# ---- a checkpoint of another model: one line before Lightning's restore --------------------------------------
def _backbone_state(norm_eval) -> dict[str, torch.Tensor]:
    from drivebench.models.common.backbone import ResNetBackbone

    return ResNetBackbone("resnet18", out_indices=(3,), norm_eval=norm_eval, width_div=8).state_dict()


def test_another_model_is_named_with_what_differs():
    from drivebench.ckpt.resume import check_model_fits

    frozen, trained = _backbone_state(True), _backbone_state(False)
    check_model_fits(trained, {"state_dict": trained, "optimizer_states": [{"param_groups": [{"params": [0] * 3}]}]},
                     [3], "x.ckpt")  # the same model: nothing to say
    check_model_fits(trained, {"state_dict": frozen}, None, "x.ckpt")  # BN's counter alone: every load takes that
    with pytest.raises(ConfigError, match=r"its optimizer trains \[3\] parameters per group, this run \[5\]"
                                          r".*It froze BatchNorm that this run trains \(stem.1 and 19 more\).*\+model.net.norm_eval=true"):
        check_model_fits(trained, {"state_dict": frozen, "optimizer_states": [{"param_groups": [{"params": [0] * 3}]}]},
                         [5], "x.ckpt")
    other = {k: v for k, v in trained.items() if not k.startswith("stages.3")}
    other["stem.0.weight"] = torch.zeros(4, 3, 7, 7)
    with pytest.raises(ConfigError) as caught:
        check_model_fits(trained, {"state_dict": other}, None, "x.ckpt")
    message = str(caught.value)
    assert message.startswith("resume: x.ckpt holds another model than this run builds (") and "\n" not in message
    assert "only in this run's model (e.g. stages.3." in message and "of other shapes (e.g. stem.0.weight: [4, 3, 7, 7]" in message


def test_resuming_a_checkpoint_with_frozen_batchnorm_says_how(tmp_path, cache):
    """A MapTR checkpoint written with the backbone's BatchNorm frozen (the setting before 2026-12-05), continued
    by a run that trains it: before, Lightning's optimizer restore raised a ValueError with a traceback."""
    maptr = ["model=maptr", "data.size=mini", "accel=none", "bench.ceiling=false", "bench.val_batches=0",
             "bench.warmup_steps=0", "ckpt=local", f"ckpt.dir={tmp_path / 'ckpt'}", "ckpt.every_n_steps=2"]
    first = run_cli([*maptr, "+model.net.norm_eval=true", f"hydra.run.dir={tmp_path / 'old'}", "bench.steps=2"],
                    cache, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    saved = step_file(tmp_path / "ckpt", 2)
    done = run_cli([*maptr, f"hydra.run.dir={tmp_path / 'new'}", "bench.steps=4", f"resume={saved}"], cache, cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-3000:]
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("drivebench:")]
    assert line.startswith(f"drivebench: error: resume: {saved} holds another model than this run builds"), line
    assert "+model.net.norm_eval=true" in line and "Traceback" not in done.stderr
    # refused before data preparation and the fit: the one line is all it printed, and nothing was logged
    assert done.stderr.strip() == line and not (tmp_path / "new" / "tb").exists()
