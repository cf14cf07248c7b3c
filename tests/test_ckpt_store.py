"""CheckpointStore (atomic local writes, fsspec URLs, listing, latest_complete), the host stager of
async saves, the RNG state a checkpoint carries, and ``resume`` resolution."""

from __future__ import annotations

import collections
import io
import os
import random
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from omegaconf import OmegaConf

from drivebench.ckpt.checkpoint_io import HostStager, StorageCheckpointIO
from drivebench.ckpt.identity import IDENTITY_KEY, RunIdentity
from drivebench.ckpt.resume import resolve_resume
from drivebench.ckpt.state import RngState, rng_state, set_rng_state
from drivebench.ckpt.store import CheckpointStore, CheckpointWriteError, checkpoint_name, step_of
from drivebench.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]


def payload(step: int) -> dict:
    return {"global_step": step, "state_dict": {"w": torch.full((64, 64), float(step))}}


def test_local_write_is_atomic_and_listing_ignores_everything_else(tmp_path):
    store = CheckpointStore(str(tmp_path / "ckpt"))
    store.prepare(needed_bytes=1)
    result = store.write(checkpoint_name(3), payload(3))
    assert result.path == str(tmp_path / "ckpt" / "step-00000003.ckpt") and result.bytes > 64 * 64 * 4
    store.write(checkpoint_name(12), payload(12))
    (tmp_path / "ckpt" / ".step-00000020.ckpt.partial").write_bytes(b"half")  # a crash's leftover
    (tmp_path / "ckpt" / "notes.txt").write_text("x")
    assert [s for s, _ in store.list_steps()] == [3, 12]
    assert sorted(os.listdir(tmp_path / "ckpt")) == [".step-00000020.ckpt.partial", "notes.txt",
                                                     "step-00000003.ckpt", "step-00000012.ckpt"]
    assert store.latest_complete().endswith("step-00000012.ckpt")
    assert torch.equal(store.load(store.latest_complete())["state_dict"]["w"], payload(12)["state_dict"]["w"])


def test_latest_complete_skips_a_corrupt_file_under_a_final_name(tmp_path):
    store = CheckpointStore(str(tmp_path))
    store.write(checkpoint_name(5), payload(5))
    (tmp_path / checkpoint_name(10)).write_bytes(b"\x80garbage")  # e.g. copied in by hand, half-way
    assert store.latest_complete() == str(tmp_path / checkpoint_name(5))


def test_interrupted_write_leaves_no_file_and_the_previous_intact(tmp_path):
    store = CheckpointStore(str(tmp_path))
    store.write(checkpoint_name(1), payload(1))
    seen = {}

    def crash(partial: str, total: int) -> None:
        seen["partial_size"] = os.path.getsize(partial)
        seen["total"] = total
        raise OSError(28, "No space left on device")

    with pytest.raises(CheckpointWriteError, match=r"step-00000002\.ckpt failed: the disk is full.*previous "
                                                   r"checkpoint is intact"):
        store.write(checkpoint_name(2), payload(2), fault=crash)
    assert 0 < seen["partial_size"] < seen["total"]  # it really was half-written when it failed
    assert sorted(os.listdir(tmp_path)) == [checkpoint_name(1)]
    assert store.load(store.latest_complete())["global_step"] == 1


def test_file_size_limit_turns_into_a_clear_error(tmp_path):
    """torch.save reports EFBIG as a RuntimeError; the store must still say what happened."""
    script = textwrap.dedent(f"""
        import resource, signal, torch
        from drivebench.ckpt.store import CheckpointStore, CheckpointWriteError
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        store = CheckpointStore({str(tmp_path)!r})
        first = store.write("step-00000001.ckpt", {{"w": torch.zeros(100_000)}})
        resource.setrlimit(resource.RLIMIT_FSIZE, (first.bytes // 2, resource.RLIM_INFINITY))
        try:
            store.write("step-00000002.ckpt", {{"w": torch.ones(100_000)}})
        except CheckpointWriteError as err:
            print("ERROR", err)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"ERROR writing checkpoint {tmp_path}/step-00000002.ckpt failed: the disk is full (or a file-size " \
           "limit was reached); the previous checkpoint is intact" in done.stdout
    assert sorted(os.listdir(tmp_path)) == ["step-00000001.ckpt"]
    assert CheckpointStore(str(tmp_path)).loadable(str(tmp_path / "step-00000001.ckpt"))


def test_file_url_is_a_local_directory(tmp_path):
    store = CheckpointStore(f"file://{tmp_path}/ckpt")
    assert store.local and store.path == tmp_path / "ckpt"
    store.prepare()
    store.write(checkpoint_name(1), payload(1))
    assert store.list_steps() == [(1, str(tmp_path / "ckpt" / checkpoint_name(1)))]


def test_memory_url_store_round_trip():
    url = f"memory://store-{uuid.uuid4().hex[:8]}/run"
    store = CheckpointStore(url)
    assert not store.local and store.list_steps() == []  # nothing there yet: not an error
    store.prepare()
    for step in (1, 2, 3):
        assert store.write(checkpoint_name(step), payload(step)).path.endswith(checkpoint_name(step))
    paths = [p for _, p in store.list_steps()]
    assert [step_of(p.rsplit("/", 1)[1]) for p in paths] == [1, 2, 3]
    assert store.exists(paths[0]) and not store.exists(paths[0] + "x")
    store.delete(paths[0])
    assert [s for s, _ in store.list_steps()] == [2, 3]
    assert store.load(store.latest_complete())["global_step"] == 3
    assert store.describe() == {"path": url, "protocol": "memory", "kind": "fsspec:memory"}


def test_unknown_protocol_and_unwritable_dir_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"ckpt\.dir=nosuchfs://x: no filesystem for protocol 'nosuchfs'"):
        CheckpointStore("nosuchfs://x")
    (tmp_path / "f").write_text("x")
    with pytest.raises(ConfigError, match=r"ckpt\.dir=.*/f/ckpt is not writable"):
        CheckpointStore(str(tmp_path / "f" / "ckpt")).prepare()
    with pytest.raises(ConfigError, match=r"has \d+ MiB free but the checkpoints of this run need"):
        CheckpointStore(str(tmp_path / "ok")).prepare(needed_bytes=2**60)


def test_rng_state_survives_a_weights_only_load():
    state = rng_state()
    expected = (torch.rand(3), np.random.rand(3), random.random())
    buf = io.BytesIO()
    torch.save({"rng": state}, buf)
    buf.seek(0)
    set_rng_state(torch.load(buf, weights_only=True)["rng"])  # how Lightning reads checkpoints on resume
    assert torch.equal(torch.rand(3), expected[0])
    assert np.array_equal(np.random.rand(3), expected[1]) and random.random() == expected[2]


Pair = collections.namedtuple("Pair", "a b")


def test_stager_copies_host_tensors_and_keeps_structure():
    weight = torch.arange(6.0)
    nested = {"state_dict": collections.OrderedDict(w=weight), "opt": [{"m": weight * 2}], "pair": Pair(weight, 3),
              "rng": (1, (2, 3)), "name": "x"}
    staged = HostStager().stage(nested)
    assert staged["name"] == "x" and staged["rng"] == (1, (2, 3)) and isinstance(staged["pair"], Pair)
    copy = staged["state_dict"]["w"]
    assert torch.equal(copy, weight) and copy.data_ptr() != weight.data_ptr()
    weight.add_(100)  # training goes on in place...
    assert torch.equal(copy, torch.arange(6.0))  # ...the snapshot does not move
    assert torch.equal(staged["pair"].a, torch.arange(6.0))


def test_stager_reserves_the_buffers_that_staging_uses():
    """Buffers reserved from the module / optimizer state dicts are the ones a later save fills: no
    allocation at save time. Device tensors stand in as 'meta' tensors here (no GPU on CI)."""
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters())
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    to_meta = lambda sd: {k: v.to("meta") for k, v in sd.items()}  # noqa: E731
    opt_sd = opt.state_dict()
    opt_sd["state"] = {i: {k: (v.to("meta") if k != "step" else v) for k, v in s.items()}
                       for i, s in opt_sd["state"].items()}
    stager = HostStager(pin=False)
    nbytes = stager.reserve({"state_dict": to_meta(model.state_dict()), "optimizer_states": [opt_sd]})
    assert nbytes == 3 * sum(p.numel() * 4 for p in model.parameters())  # weights + two moments
    assert set(stager._buffers) == {"/state_dict/weight", "/state_dict/bias"} | {
        f"/optimizer_states/0/state/{i}/{k}" for i in (0, 1) for k in ("exp_avg", "exp_avg_sq")}
    before = dict(stager._buffers)
    assert stager.reserve({"state_dict": to_meta(model.state_dict()), "optimizer_states": [opt_sd]}) == nbytes
    assert all(stager._buffers[k] is before[k] for k in before), "a second reserve allocates nothing"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_stager_moves_device_tensors_into_reused_pinned_buffers():
    stager = HostStager()
    weight = torch.arange(6.0, device="cuda")
    assert stager.reserve({"w": weight}) == 24
    reserved = stager._buffers["/w"]
    first = stager.stage({"w": weight})["w"]
    assert first is reserved
    torch.cuda.synchronize()
    assert first.device.type == "cpu" and first.is_pinned() and torch.equal(first, weight.cpu())
    weight.add_(1)
    second = stager.stage({"w": weight})["w"]
    torch.cuda.synchronize()
    assert second.data_ptr() == first.data_ptr() and torch.equal(second, weight.cpu())


# ---- resume resolution -----------------------------------------------------------------------
def cfg(resume, outputs_root):
    return OmegaConf.create({"resume": resume, "paths": {"outputs_root": str(outputs_root)}})


def training(clip: float = 0.5, model: str = "qcnet") -> dict:
    """A resolved config, as much of one as the identity reads."""
    return {"model": {"name": model, "size": "test", "optimizer": {"lr": 1e-3}}, "data": {"name": "argoverse2"},
            "seed": 1, "trainer": {"gradient_clip_val": clip, "max_steps": 10}}


def fake_run(root: Path, name: str, steps: list[int], config: dict, mtime: float | None = None) -> Path:
    """An earlier run's checkpoints, named and stamped with the identity of ``config``."""
    run = root / name
    store = CheckpointStore(str(run / "checkpoints"))
    store.prepare()
    identity = RunIdentity.of_config(config, 1)
    for step in steps:
        name_ = checkpoint_name(step, identity)
        store.write(name_, {**payload(step), IDENTITY_KEY: identity.to_dict()})
        if mtime is not None:
            os.utime(run / "checkpoints" / name_, (mtime + step, mtime + step))
    return run


def test_resume_auto_prefers_ckpt_dir_then_newest_run_of_the_same_training(tmp_path):
    outputs = tmp_path / "outputs"
    fake_run(outputs, "old", [4, 8], training(), mtime=1_000)
    newest = fake_run(outputs, "new", [2], training(), mtime=2_000)
    fake_run(outputs, "other-clip", [50], training(clip=1.0), mtime=3_000)  # newer, but other training
    fake_run(outputs, "other-model", [60], training(model="maptr"), mtime=4_000)
    me = RunIdentity.of_config(training(), 1)
    plan = resolve_resume(cfg("auto", outputs), None, me)
    assert plan.path == str(next((newest / "checkpoints").iterdir()))
    assert me.run_id == plan.theirs.run_id  # the same training: the run continues under its id

    own = CheckpointStore(str(tmp_path / "own"))
    own.prepare()
    mine = RunIdentity.of_config(training(), 1)
    own.write(checkpoint_name(1, mine), {**payload(1), IDENTITY_KEY: mine.to_dict()})
    assert resolve_resume(cfg("auto", outputs), own, RunIdentity.of_config(training(), 1)).path == str(
        tmp_path / "own" / checkpoint_name(1, mine))
    assert resolve_resume(cfg("auto", tmp_path / "nothing"), None, me).path is None  # fresh start
    assert resolve_resume(cfg(None, outputs), own, me) is None


def test_resume_explicit_paths_and_urls(tmp_path):
    me = RunIdentity.of_config(training(), 1)
    with pytest.raises(ConfigError, match=r"resume=.*missing\.ckpt does not exist"):
        resolve_resume(cfg(str(tmp_path / "missing.ckpt"), tmp_path), None, me)
    with pytest.raises(ConfigError, match=r"resume=memory://.* does not exist"):
        resolve_resume(cfg("memory://nowhere/step-00000001.ckpt", tmp_path), None, me)
    CheckpointStore(str(tmp_path)).write(checkpoint_name(7), payload(7))
    local = str(tmp_path / checkpoint_name(7))
    assert resolve_resume(cfg(f"file://{local}", tmp_path), None, me).path == local


def test_the_checkpoint_io_reads_remote_checkpoints_with_the_options_of_its_filesystem(tmp_path):
    """Lightning reads ``ckpt_path`` through the Trainer's checkpoint IO: a URL on ckpt.dir's
    filesystem with ckpt.storage_options (no local copy), a local path or file:// URL as it is."""
    options = {"token": "sekrit-token"}
    url = f"memory://resume-{uuid.uuid4().hex[:8]}/run"
    path = CheckpointStore(url, options).write(checkpoint_name(4), payload(4)).path
    reader = StorageCheckpointIO(f"memory://other-{uuid.uuid4().hex[:8]}", storage_options=options)
    assert reader.load_checkpoint(path)["global_step"] == 4
    local = CheckpointStore(str(tmp_path)).write(checkpoint_name(5), payload(5)).path
    assert StorageCheckpointIO(None).load_checkpoint(local)["global_step"] == 5  # ckpt=none reads too
    assert StorageCheckpointIO(None).load_checkpoint(f"file://{local}")["global_step"] == 5
    with pytest.raises(ConfigError, match="ckpt=none writes no checkpoints"):
        StorageCheckpointIO(None).save_checkpoint(payload(6), str(tmp_path / checkpoint_name(6)))


def test_the_io_writes_only_inside_its_store_and_prunes_through_remove(tmp_path):
    io = StorageCheckpointIO(str(tmp_path / "ckpt"), keep_last_k=2)
    io.store.prepare()
    for step in (1, 2, 3):
        with io.blocking():
            io.save_checkpoint(payload(step), io.path_for(step))
    assert [step for step, _ in io.store.list_steps()] == [2, 3]
    assert [s["step"] for s in io.saves] == [1, 2, 3] and all(s["blocking_s"] > 0 for s in io.saves)
    with pytest.raises(ValueError, match="not in ckpt.dir"):
        io.save_checkpoint(payload(4), str(tmp_path / "elsewhere" / checkpoint_name(4)))


def test_a_checkpoint_of_the_older_layout_resumes_its_rng_and_data_position():
    """Before the loader was stateful, RNG states and the data position lived under ``drivebench``:
    RngState restores the former and hands the latter to Lightning's loop state."""
    random.seed(11)
    old = {"global_step": 4, "drivebench": {"rng": rng_state(), "data_position": (1, 3), "global_step": 4},
           "loops": {"fit_loop": {"state_dict": {}}}}
    expected = random.random()
    random.seed(99)
    RngState().on_load_checkpoint(None, None, old)
    assert random.random() == expected
    assert old["loops"]["fit_loop"]["state_dict"]["combined_loader"] == [{"epoch": 1, "batches_done": 3}]
