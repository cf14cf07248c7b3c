"""The doctor's slow checks on the CPU, its probe deadlines, and the P2P verdict and cache (no GPU needed)."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest

from drivebench.doctor import gpus, probe, storage, torch_compile
from drivebench.doctor.context import build_context
from drivebench.doctor.probe import ProbeRun
from drivebench.doctor.result import Status
from drivebench.hardware import nvml, p2p
from drivebench.hardware.p2p import PairMeasure, cached_p2p_verdict, recommend_p2p, write_verdict


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path):
    monkeypatch.setenv("DRIVEBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)


# --- probes: a hang becomes a record, not a hung doctor ---------------------------------------------

def test_a_hanging_probe_is_killed_at_its_deadline(tmp_path):
    (tmp_path / "hanging_probe.py").write_text(textwrap.dedent(f"""
        import time
        print({probe.RECORD_PREFIX!r} + '{{"event": "start", "pair": [0, 1]}}', flush=True)
        time.sleep(120)
    """))
    env = probe.probe_env({"PYTHONPATH": str(tmp_path)})
    run = probe.run_probe("hanging_probe", [], timeout_s=60, env=env, idle_timeout_s=1.0)
    assert run.timed_out and not run.ok and run.elapsed_s < 30
    assert run.records == [{"event": "start", "pair": [0, 1]}]
    assert "killed" in run.failure()
    assert env["NCCL_NVLS_ENABLE"] == "0"


def test_pair_runner_marks_the_hung_pair_and_measures_the_rest(monkeypatch):
    launches = []

    def scripted(module, args, timeout_s, env, idle_timeout_s):
        launches.append(args[args.index("--pairs") + 1])
        if len(launches) == 1:  # 0-1 fine, then hangs inside 0-2
            return ProbeRun([{"event": "start", "pair": [0, 1]}, {"event": "done", "pair": [0, 1], "busbw_gbs": 9},
                             {"event": "start", "pair": [0, 2]}], returncode=-9, timed_out=True, elapsed_s=45)
        return ProbeRun([{"event": "start", "pair": [1, 2]}, {"event": "done", "pair": [1, 2], "busbw_gbs": 8}],
                        returncode=0)

    monkeypatch.setattr(gpus, "run_probe", scripted)
    results = gpus._run_pairs("m", [(0, 1), (0, 2), (1, 2)], [], {"MASTER_PORT": "0"}, 10, 5)
    assert launches == ["0-1,0-2,1-2", "1-2"]
    assert results[(0, 1)]["busbw_gbs"] == 9 and results[(1, 2)]["busbw_gbs"] == 8
    assert results[(0, 2)]["hung"] and "hung" in results[(0, 2)]["error"]


def test_pair_runner_gives_up_after_repeated_hangs(monkeypatch):
    def always_hangs(module, args, timeout_s, env, idle_timeout_s):
        first = args[args.index("--pairs") + 1].split(",")[0]
        return ProbeRun([{"event": "start", "pair": [int(x) for x in first.split("-")]}], returncode=-9,
                        timed_out=True)

    monkeypatch.setattr(gpus, "run_probe", always_hangs)
    results = gpus._run_pairs("m", [(0, 1), (0, 2), (1, 2), (0, 3)], [], {}, 10, 5, max_hangs=2)
    assert [bool(results[p].get("hung")) for p in [(0, 1), (0, 2)]] == [True, True]
    assert results[(1, 2)]["skipped"] and results[(0, 3)]["skipped"]
    skipped = gpus._pair_measure((1, 2), results[(1, 2)], results[(1, 2)], "NVL")
    assert skipped.on_ok is None and not skipped.dead  # unmeasured is not "NCCL is broken"


def test_corrupt_peer_copy_warns_or_fails_by_config(monkeypatch):
    import torch

    monkeypatch.setattr(gpus, "_cuda_gpus", lambda: (torch, 2, None))
    monkeypatch.setattr(gpus, "run_probe", lambda *a, **k: ProbeRun([
        {"event": "start", "pair": [0, 1]},
        {"event": "done", "pair": [0, 1], "access_ab": True, "access_ba": True, "copy_gbs": 20.0, "correct": False}],
        returncode=0))
    result = gpus.p2p_access(build_context([], skip_slow=True))
    assert result.status is Status.WARN and "differ from the source" in result.saw and "ACS" in result.remedy
    assert gpus.p2p_access(build_context(["dist=ddp", "dist.p2p=on"], skip_slow=True)).status is Status.FAIL


def test_arch_support_follows_cuda_binary_compatibility():
    assert gpus._arch_supported((9, 0), ["sm_80", "sm_90"])
    assert gpus._arch_supported((8, 9), ["sm_80", "sm_86"])       # sm_86 cubins run on 8.9
    assert not gpus._arch_supported((12, 0), ["sm_80", "sm_90"])  # no kernels for a newer major
    assert gpus._arch_supported((12, 0), ["sm_90", "compute_90"])  # PTX JIT covers it


# --- the P2P verdict -------------------------------------------------------------------------------

def pair(a, b, level, on=(True, 250.0), off=(True, 27.0)):
    return PairMeasure(a, b, level, on[0], on[1], None if on[0] else "hung", off[0], off[1], None)


def test_verdict_on_when_p2p_works_everywhere():
    assert recommend_p2p([pair(0, 1, "NVL"), pair(0, 2, "NVL"), pair(1, 2, "NVL")]).value == "on"


def test_verdict_off_when_a_pair_hangs_with_p2p():
    verdict = recommend_p2p([pair(0, 1, "PHB", on=(False, None))])
    assert verdict.value == "off" and verdict.bad_pairs == ["0-1"]


def test_verdict_off_when_p2p_is_slower_than_without():
    assert recommend_p2p([pair(0, 1, "PIX", on=(True, 10.0), off=(True, 25.0))]).value == "off"


def test_verdict_is_a_level_when_p2p_breaks_only_beyond_it():
    pairs = [pair(0, 1, "NVL"), pair(2, 3, "NVL"), pair(0, 2, "SYS", on=(False, None)),
             pair(1, 3, "SYS", on=(False, None))]
    assert recommend_p2p(pairs).value == "NVL"
    pairs.append(pair(0, 3, None, on=(False, None)))  # a link of unknown kind: no level is safe
    assert recommend_p2p(pairs).value == "off"


def test_dead_pairs_are_not_blamed_on_p2p():
    verdict = recommend_p2p([pair(0, 1, "PIX", on=(False, None), off=(False, None))])
    assert verdict.dead_pairs == ["0-1"]
    assert recommend_p2p([]).value is None


# --- the cache that dist.p2p=auto reads --------------------------------------------------------------

@pytest.fixture
def two_h200(monkeypatch):
    monkeypatch.setattr(nvml, "visible_gpu_names", lambda: ["NVIDIA H200", "NVIDIA H200"])
    monkeypatch.setattr(nvml, "driver_info", lambda: ("570.86.15", "12.8"))


def test_cached_verdict_from_a_hand_written_file(tmp_path, two_h200, monkeypatch):
    cache = tmp_path / "c"
    (cache / "doctor").mkdir(parents=True)
    (cache / "doctor" / "p2p.json").write_text(json.dumps({"version": 1, "machines": {
        "2x[NVIDIA H200, NVIDIA H200] driver 570.86.15": {"verdict": "off"},
        "8x[NVIDIA A100-SXM4-80GB, NVIDIA A100-SXM4-80GB] driver 535.1": {"verdict": "NVL"},
    }}))
    assert cached_p2p_verdict(cache) == "off"
    monkeypatch.setattr(nvml, "driver_info", lambda: ("580.1", "13.0"))  # a new driver: measure again
    assert cached_p2p_verdict(cache) is None
    assert cached_p2p_verdict(tmp_path / "nowhere") is None


def test_cached_verdict_rejects_garbage(tmp_path, two_h200):
    path = tmp_path / "doctor" / "p2p.json"
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    assert cached_p2p_verdict(tmp_path) is None
    path.write_text(json.dumps({"machines": {"2x[NVIDIA H200, NVIDIA H200] driver 570.86.15": {"verdict": "maybe"}}}))
    assert cached_p2p_verdict(tmp_path) is None


def test_no_gpu_means_no_verdict(tmp_path, monkeypatch):
    monkeypatch.setattr(nvml, "visible_gpu_names", lambda: None)
    assert p2p.current_machine_key() is None  # falls back to torch, which sees no GPU here
    assert cached_p2p_verdict(tmp_path) is None


def test_write_verdict_keeps_other_machines(tmp_path, two_h200):
    write_verdict(tmp_path, "other", recommend_p2p([pair(0, 1, "NVL")]), [])
    key = p2p.current_machine_key()
    write_verdict(tmp_path, key, recommend_p2p([pair(0, 1, "PHB", on=(False, None))]), [])
    machines = p2p.read_cache(tmp_path)
    assert machines["other"]["verdict"] == "on" and cached_p2p_verdict(tmp_path) == "off"


def test_allreduce_check_caches_its_verdict_and_fails_when_config_forces_p2p(tmp_path, monkeypatch, two_h200):
    import torch

    monkeypatch.setattr(gpus, "_cuda_gpus", lambda: (torch, 2, None))
    pcie = {"link": "PCIe", "nccl_level": "PHB"}
    monkeypatch.setattr(gpus, "_pair_levels", lambda pairs: {p: pcie for p in pairs})
    measured = {True: {(0, 1): {"error": "hung: no answer after 45 s (killed)"}},
                False: {(0, 1): {"busbw_gbs": 21.0, "correct": True}}}
    monkeypatch.setattr(gpus, "_measure_allreduce", lambda count, pairs, p2p: measured[p2p])
    ctx = build_context(["dist=ddp", "dist.p2p=on"], skip_slow=False)
    result = gpus.nccl_allreduce(ctx)
    assert result.status is Status.FAIL and "dist.p2p=off" in result.remedy
    assert cached_p2p_verdict(ctx.cache_root) == "off"
    ctx = build_context(["dist=ddp"], skip_slow=False)  # p2p=auto will read the cache: only a warning
    assert gpus.nccl_allreduce(ctx).status is Status.WARN


# --- slow checks that do run on the CPU --------------------------------------------------------------

def fake_av2_root(root: Path) -> Path:
    for split in ("train", "val"):
        for i in range(3):
            scenario = root / split / f"s{i}"
            scenario.mkdir(parents=True)
            (scenario / f"scenario_s{i}.parquet").write_bytes(os.urandom(256 * 1024))
            (scenario / f"log_map_archive_s{i}.json").write_text("{}")
    return root


def test_storage_bandwidth_checks_measure_and_clean_up(tmp_path):
    root = fake_av2_root(tmp_path / "av2")
    ckpt = tmp_path / "ckpt"
    ctx = build_context([f"ckpt.dir={ckpt}", f"data.root={root}", "model.size=test"], skip_slow=False)
    write = storage.ckpt_write_check(ctx)
    assert write.status is Status.PASS and write.data["mb_per_s"] > 0
    assert write.data["write"]["nbytes"] == ctx.checkpoint_bytes()[0]
    read = storage.data_read_check(ctx)
    assert read.status is Status.PASS and read.data["files"] == 12 and read.data["bytes"] >= 6 * 256 * 1024
    ctx.made.cleanup()
    assert not ckpt.exists()  # the doctor made it, the doctor removed it
    kept = sorted(p.name for p in (root / "train" / "s0").iterdir())
    assert kept == ["log_map_archive_s0.json", "scenario_s0.parquet"]  # the dataset is only read


def test_slow_network_checkpoint_mount_warns(tmp_path, monkeypatch):
    ctx = build_context([f"ckpt.dir={tmp_path / 'ckpt'}", "model.size=test"], skip_slow=False)
    monkeypatch.setattr(storage, "filesystem_of", lambda p: {"path": str(p), "mount": "/mnt/nfs", "fstype": "nfs4",
                                                             "free_gb": 500.0})
    monkeypatch.setattr(storage, "write_probe", lambda d, n: storage.WriteStats(n, n / 50e6, 0.5))
    monkeypatch.setattr(storage, "local_write", lambda c, n: storage.WriteStats(n, n / 1e9, 0.01))
    result = storage.ckpt_write_check(ctx)
    assert result.status is Status.WARN and "20.0x slower" in result.saw and "local disk" in result.remedy


def test_missing_real_data_root_fails_with_remedy(tmp_path):
    ctx = build_context([f"data.root={tmp_path / 'missing'}"], skip_slow=True)
    result = storage.data_root_check(ctx)
    assert result.status is Status.FAIL and "does not exist" in result.saw and "data.root" in result.remedy


@pytest.mark.slow  # a real inductor compile with cold caches: ~15-35 s on 2 cores
def test_torch_compile_smoke_test_on_cpu(tmp_path):
    ctx = build_context([], skip_slow=False)
    result = torch_compile.compile_cpu(ctx)
    assert result.status is Status.PASS, result.saw
    assert result.data["compile_s"] > 0 and result.data["max_abs_diff"] < 1e-3
    assert torch_compile.compile_cuda(ctx).status is Status.INFO


def test_compile_failure_is_fail_only_where_the_config_compiles(monkeypatch):
    monkeypatch.setattr(torch_compile, "run_probe", lambda *a, **k: ProbeRun(
        [{"ok": False, "error": "InvalidCxxCompiler: No working C++ compiler found"}], returncode=0))
    ctx = build_context(["machine.accelerator=cpu", "accel.compile=true"], skip_slow=False)
    result = torch_compile.compile_cpu(ctx)
    assert result.status is Status.FAIL and "C++ compiler" in result.saw and "accel.compile=false" in result.remedy
    ctx = build_context(["accel.compile=false"], skip_slow=False)
    assert torch_compile.compile_cpu(ctx).status is Status.WARN


def test_remote_checkpoint_url_is_checked_with_fsspec():
    ctx = build_context(["ckpt=remote", "ckpt.dir=memory://doctor-test/run", "model.size=test"], skip_slow=False)
    result = storage.ckpt_dir_check(ctx)
    assert result.status is Status.PASS and "remote store (memory)" in result.saw
    write = storage.ckpt_write_check(ctx)
    assert write.status is Status.PASS and write.data["write"]["nbytes"] == ctx.checkpoint_bytes()[0]
    import fsspec

    assert fsspec.filesystem("memory").ls("/doctor-test/run") == []  # the probe object was removed


@pytest.mark.slow  # three spawned ranks import torch: ~10-25 s on 2 cores
def test_allreduce_probe_measures_every_pair_over_gloo(monkeypatch):
    """The NCCL probe's orchestration (spawned ranks, pair groups, records, barriers) run on the CPU with gloo."""
    env = probe.probe_env({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "0"})
    results = gpus._run_pairs("drivebench.doctor._allreduce_probe", [(0, 1), (0, 2), (1, 2)],
                              ["--world", "3", "--mib", "1", "--warmup", "1", "--iters", "2", "--backend", "gloo"],
                              env, startup_s=180, pair_s=60)
    assert set(results) == {(0, 1), (0, 2), (1, 2)}
    for pair, record in results.items():
        assert "error" not in record, record
        assert record["correct"] and record["busbw_gbs"] > 0


def test_remote_preset_without_url_is_a_config_error():
    # ckpt=remote has no default destination: the run (and so the doctor) stops before any check
    from drivebench.errors import ConfigError

    with pytest.raises(ConfigError, match=r"ckpt=remote needs a destination: ckpt.dir="):
        build_context(["ckpt=remote"], skip_slow=True)
