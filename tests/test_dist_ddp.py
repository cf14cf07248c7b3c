"""Real 2-rank DDP runs on the CPU (gloo): Lightning's launcher, torchrun, Hydra multirun, a dead rank.

Each run is a subprocess of ``python -m drivebench`` on MapTR's test size. A probe (a
``sitecustomize`` on PYTHONPATH, active only with DRIVEBENCH_TEST_PROBE) records in every process,
rank processes included: the NCCL_* variables at the moment ``init_process_group`` is called, and
the samples each rank trained on (``sequence_id``, ``frame_idx`` of every batch, per epoch).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from drivebench.dist import FAULT_EXIT_CODE

REPO = Path(__file__).resolve().parents[1]
RUN = ["model=maptr", "model.size=test", "model.batch_size=2", "data.size=mini", "accel=none",
       "trainer.max_steps=6", "bench.warmup_steps=1", "bench.val_batches=0", "bench.ceiling=false", "ckpt=none",
       "~logger"]
DDP = ["dist=ddp", "dist.devices=2"]

PROBE = '''
import json, os

_OUT = os.environ.get("DRIVEBENCH_TEST_PROBE")
if _OUT:
    import lightning.pytorch as _pl
    import torch.distributed as _dist

    def _write(kind, record):
        with open(os.path.join(_OUT, f"{kind}-{os.getpid()}-{len(os.listdir(_OUT))}.json"), "w") as f:
            json.dump(record, f)

    _init = _dist.init_process_group

    def _recording_init(*args, **kwargs):
        nccl = {k: v for k, v in os.environ.items() if k.startswith("NCCL_")}
        result = _init(*args, **kwargs)
        _write("pg", {"rank": _dist.get_rank(), "world_size": _dist.get_world_size(), "nccl_env": nccl})
        return result

    _dist.init_process_group = _recording_init

    class _SampleRecorder(_pl.Callback):
        def __init__(self):
            self.batches = []

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            ids = list(zip(batch["sequence_id"].tolist(), batch["frame_idx"].tolist()))
            self.batches.append({"epoch": trainer.current_epoch, "ids": ids})

        def on_train_end(self, trainer, pl_module):
            _write("samples", {"rank": trainer.global_rank, "world_size": trainer.world_size, "batches": self.batches})

    _trainer_init = _pl.Trainer.__init__

    def _init_with_recorder(self, *args, callbacks=None, **kwargs):
        _trainer_init(self, *args, callbacks=[*(callbacks or []), _SampleRecorder()], **kwargs)

    _pl.Trainer.__init__ = _init_with_recorder

    if os.environ.get("DRIVEBENCH_TEST_FAKE_GPUS"):  # dist.p2p=auto looks its verdict up by GPU names
        from drivebench.hardware import nvml as _nvml

        _nvml.visible_gpu_names = lambda: ["NVIDIA H200", "NVIDIA H200"]
        _nvml.driver_info = lambda: ("570.86.15", "12.8")
'''


class Runner:
    """Runs drivebench with the probe; every run of this module shares one dataset cache."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.cache = root / "cache"
        self.site = root / "site"
        self.site.mkdir()
        (self.site / "sitecustomize.py").write_text(PROBE)

    def env(self, cwd: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
        probe, scratch = cwd / "probe", cwd / "tmp"
        probe.mkdir(parents=True, exist_ok=True)
        scratch.mkdir(exist_ok=True)
        clean = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "WORLD_SIZE", "RANK")}
        return {**clean, "DRIVEBENCH_CACHE": str(self.cache), "DRIVEBENCH_TEST_PROBE": str(probe),
                "TMPDIR": str(scratch), "PYTHONPATH": os.pathsep.join([str(self.site), str(REPO)]), **(extra or {})}

    def __call__(self, args: list[str], cwd: Path, launcher: list[str] | None = None, timeout: float = 180,
                 env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess, Path, float]:
        start = time.monotonic()
        result = subprocess.run([sys.executable, *(launcher or []), "-m", "drivebench", *args], cwd=cwd,
                                env=self.env(cwd, env), capture_output=True, text=True, timeout=timeout)
        return result, cwd / "probe", time.monotonic() - start


@pytest.fixture(scope="module")
def drivebench(tmp_path_factory):
    return Runner(tmp_path_factory.mktemp("dist"))


def records(probe: Path, kind: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(probe.glob(f"{kind}-*.json"))]


def summaries(root: Path) -> list[Path]:
    return sorted(root.rglob("summary.json"))


def check_ranks(summary: dict) -> None:
    """One summary for the run: both ranks' figures, global throughput, the slowest rank."""
    ranks = summary["ranks"]
    assert ranks["world_size"] == 2
    per_rank = ranks["per_rank"]
    assert [r["rank"] for r in per_rank] == [0, 1]
    assert all(r["samples"] > 0 and r["wall_s"] > 0 for r in per_rank)
    expected = sum(r["samples"] for r in per_rank) / max(r["wall_s"] for r in per_rank)
    assert ranks["global_samples_per_s"] == pytest.approx(expected)
    assert summary["train"]["global_samples_per_s"] == pytest.approx(expected)
    assert ranks["global_samples_per_s"] > max(r["samples_per_s"] for r in per_rank)
    worst = max(per_rank, key=lambda r: (r["data_wait_fraction"], r["step_s_median"]))
    assert ranks["slowest_rank"] == worst["rank"]
    assert summary["settings"]["global_batch_size"] == 2 * summary["settings"]["batch_size"]


def check_disjoint_samples(probe: Path) -> None:
    """In every epoch, no sample was trained on by both ranks."""
    seen = {r["rank"]: r for r in records(probe, "samples")}
    assert sorted(seen) == [0, 1] and all(r["world_size"] == 2 for r in seen.values())
    epochs = {b["epoch"] for r in seen.values() for b in r["batches"]}
    assert epochs
    for epoch in epochs:
        per_rank = [[tuple(i) for b in seen[rank]["batches"] if b["epoch"] == epoch for i in b["ids"]]
                    for rank in (0, 1)]
        assert per_rank[0] and per_rank[1]
        for ids in per_rank:
            assert len(ids) == len(set(ids)), f"a rank saw a sample twice in epoch {epoch}"
        assert not set(per_rank[0]) & set(per_rank[1]), f"both ranks trained on the same sample in epoch {epoch}"


@pytest.fixture(scope="module")
def checkpointed_run(drivebench, tmp_path_factory):
    """One Lightning-launched 2-rank run, shared by the two tests below (a DDP run is mostly the start-up of
    its ranks): p2p off, and an asynchronous checkpoint after every step into a folder outside the run
    directory (``root/ckpt``). The run directory is ``root/first``, the ranks' working directory ``root/a``."""
    root = tmp_path_factory.mktemp("ddp-ckpt")
    no_ckpt = [o for o in RUN if o != "ckpt=none"]
    ckpt = ["ckpt=async", f"ckpt.dir={root / 'ckpt'}", "ckpt.every_n_minutes=1e-6", "ckpt.keep_last_k=0"]
    result, probe, _ = drivebench([*no_ckpt, *DDP, "dist.p2p=off", *ckpt, f"hydra.run.dir={root / 'first'}"],
                                  cwd=root / "a")
    return root, result, probe


def test_lightning_ddp_one_summary_disjoint_samples_and_p2p_off(checkpointed_run):
    tmp_path, result, probe = checkpointed_run
    run_dir = tmp_path / "first"
    assert result.returncode == 0, result.stderr[-3000:]
    assert summaries(tmp_path) == [run_dir / "summary.json"]
    summary = json.loads((run_dir / "summary.json").read_text())
    check_ranks(summary)
    check_disjoint_samples(probe)
    assert summary["dist"]["p2p"]["applied"] == "off" and summary["dist"]["p2p"]["env"]["NCCL_P2P_DISABLE"] == "1"
    inits = records(probe, "pg")
    assert sorted(r["rank"] for r in inits) == [0, 1]  # one process group per rank, set up once
    assert all(r["nccl_env"].get("NCCL_P2P_DISABLE") == "1" for r in inits)  # before the group started
    # the rank process ran in this directory without writing its own config or log there
    assert sorted(p.name for p in run_dir.iterdir()) == [".hydra", "__main__.log", "summary.json"]


def test_ddp_runs_every_phase_train_ceiling_and_validation(drivebench, tmp_path):
    """The default bench runs three Trainers in one job; the later two must reuse the job's ranks
    (they once stopped with a ConfigError: Lightning leaves LOCAL_RANK set after the first fit)."""
    run_dir = tmp_path / "run"
    phases = [o for o in RUN if not o.startswith(("bench.val_batches", "bench.ceiling"))]
    phases += ["bench.val_batches=2", "bench.ceiling_steps=2", "bench.ceiling_warmup_steps=1"]
    result, probe, _ = drivebench([*phases, *DDP, f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    check_ranks(summary)
    assert summary["ceiling"]["global_samples_per_s"] > 0 and summary["efficiency"] > 0
    assert "loss" in summary["val"]
    assert 0.0 <= summary["val"]["mAP"] <= 1.0  # the chamfer AP, its states gathered from both ranks
    assert sorted(r["rank"] for r in records(probe, "pg")) == [0, 1]  # the group was set up once per rank


def test_ddp_checkpoints_and_resume_mid_epoch_on_every_rank(drivebench, checkpointed_run, tmp_path):
    """Every rank takes each save (Lightning's save has a barrier; the every_n_minutes decision is
    rank 0's, broadcast), rank 0 writes; a resumed DDP run gives every rank the batches it would
    have had next (the loader position in the checkpoint is rank 0's, the same on every rank)."""
    root, result, probe = checkpointed_run
    ckpt_dir, first = root / "ckpt", root / "first"
    assert result.returncode == 0, result.stderr[-3000:]
    saves = json.loads((first / "summary.json").read_text())["checkpoints"]
    assert [s["step"] for s in saves["each"]] == [1, 2, 3, 4, 5, 6]  # a save after every step
    straight = {r["rank"]: r["batches"] for r in records(probe, "samples")}

    resumed_dir = tmp_path / "resumed"
    result, probe, _ = drivebench([*RUN, *DDP, f"resume={next(ckpt_dir.glob('step-00000003-*.ckpt'))}",
                                   f"hydra.run.dir={resumed_dir}"], cwd=tmp_path / "b")
    assert result.returncode == 0, result.stderr[-3000:]
    resumed = {r["rank"]: r["batches"] for r in records(probe, "samples")}
    assert sorted(resumed) == [0, 1]
    for rank in (0, 1):
        assert straight[rank][2]["epoch"] == straight[rank][3]["epoch"], "step 3 should be mid-epoch"
        assert resumed[rank] == straight[rank][3:], f"rank {rank} resumed elsewhere"


def test_torchrun_one_run_dir_under_outputs_root(drivebench, tmp_path):
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    result, probe, _ = drivebench([*RUN, "dist=ddp", "dist.p2p=NVL"], cwd=tmp_path, launcher=launcher)
    assert result.returncode == 0, result.stderr[-3000:]
    found = summaries(tmp_path)
    assert len(found) == 1, found
    run_dir = found[0].parent
    assert run_dir.parent.parent == tmp_path / "outputs"
    run_dirs = [p for p in (tmp_path / "outputs").glob("*/*") if p.is_dir()]
    assert run_dirs == [run_dir], "a rank > 0 made its own run directory"
    assert not list((tmp_path / "tmp").glob("drivebench-rank*")), "rank scratch directories were left behind"
    summary = json.loads(found[0].read_text())
    check_ranks(summary)
    check_disjoint_samples(probe)
    assert summary["dist"]["p2p"]["applied"] == "NVL"
    assert [r["nccl_env"].get("NCCL_P2P_LEVEL") for r in records(probe, "pg")] == ["NVL", "NVL"]


def test_multirun_with_ddp_runs_each_job_once(drivebench, tmp_path):
    # dist.p2p=auto with a doctor verdict cached for (pretend) GPUs: every job applies it
    from drivebench.hardware.p2p import P2PVerdict, machine_key, write_verdict

    key = machine_key(["NVIDIA H200", "NVIDIA H200"], "570.86.15")  # what the probe's fake NVML reports
    write_verdict(drivebench.cache, key, P2PVerdict("PIX", "measured by the test"), [])
    sweep = tmp_path / "sweep"
    result, probe, _ = drivebench(["-m", *RUN, *DDP, "seed=1,2", "dist.p2p=auto", f"hydra.sweep.dir={sweep}"],
                                  cwd=tmp_path, timeout=300, env={"DRIVEBENCH_TEST_FAKE_GPUS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = sorted(p.name for p in sweep.iterdir() if p.is_dir())
    assert jobs == ["0_maptr_none", "1_maptr_none"]
    assert summaries(tmp_path) == [sweep / job / "summary.json" for job in jobs]
    assert not (tmp_path / "outputs").exists() and len(list(tmp_path.rglob("multirun.yaml"))) == 1
    for job, seed in zip(jobs, (1, 2)):
        summary = json.loads((sweep / job / "summary.json").read_text())
        assert summary["run"]["seed"] == seed
        assert summary["ranks"]["world_size"] == 2 and len(summary["ranks"]["per_rank"]) == 2
        assert summary["dist"]["p2p"]["applied"] == "PIX" and summary["dist"]["p2p"]["source"] == "doctor cache"
    inits = records(probe, "pg")  # exactly two ranks per job: no rank started the sweep again
    assert sorted(r["rank"] for r in inits) == [0, 0, 1, 1]
    assert all(r["nccl_env"].get("NCCL_P2P_LEVEL") == "PIX" for r in inits)


def test_torchrun_multirun_keeps_one_sweep_dir_and_runs_every_job(drivebench, tmp_path):
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    args = ["-m", *RUN, "trainer.max_steps=4", "dist=ddp", "seed=1,2"]
    result, probe, _ = drivebench(args, cwd=tmp_path, launcher=launcher, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    sweeps = list((tmp_path / "outputs" / "multirun").glob("*/*"))
    assert len(sweeps) == 1, "a rank > 0 made its own sweep directory"
    assert sorted(p.name for p in sweeps[0].iterdir()) == ["0_maptr_none", "1_maptr_none", "multirun.yaml"]
    for job, seed in (("0_maptr_none", 1), ("1_maptr_none", 2)):
        summary = json.loads((sweeps[0] / job / "summary.json").read_text())
        assert summary["run"]["seed"] == seed and summary["ranks"]["world_size"] == 2
    # the second job ran in the first job's process group (a new one would hang in torchrun's store)
    assert sorted(r["rank"] for r in records(probe, "pg")) == [0, 1]
    assert len(records(probe, "samples")) == 4  # two jobs trained on both ranks


def _timed_lines(stream, into: list[tuple[float, str]]) -> threading.Thread:
    """Read ``stream`` line by line into ``into`` as (monotonic time, line), in a thread; at its end
    (every process holding the pipe has closed it) one more entry, (time, "")."""
    def pump() -> None:
        for line in stream:
            into.append((time.monotonic(), line))
        into.append((time.monotonic(), ""))
    thread = threading.Thread(target=pump, daemon=True)
    thread.start()
    return thread


def test_a_dead_or_stuck_rank_stops_the_run_naming_it(drivebench, tmp_path):
    """Three runs, two at a time (the stuck one mostly waits): rank 1 exits abruptly after step 2 in one,
    stops responding after step 2 in another; in the third rank 0, the process that launched rank 1, exits
    abruptly (as the OOM killer would end it), and rank 1 says so by name. Hard time limits: a hang fails
    the test.

    The limits count from the fault (the line the faulty rank prints as it exits or stops), not from the
    start: start-up and two steps take what a loaded 2-core machine gives them (CI once took 87.6 s for
    a whole run against a fixed 84 s), while what is tested, noticing the fault, does not scale with it."""
    import psutil

    timeout_s = 24  # also bounds the rendezvous, so it must exceed a rank's start-up time here
    after_fault_s = timeout_s + 36  # the timeout, then the launcher ending the other rank and the report
    args = [*RUN, *DDP, "trainer.max_steps=200", f"dist.timeout_minutes={timeout_s / 60}"]
    fault = {"DRIVEBENCH_FAULT_EXIT_RANK": "1", "DRIVEBENCH_FAULT_EXIT_STEP": "2"}
    runs = {}

    def start(kind: str, extra: dict[str, str]) -> None:
        cwd = tmp_path / kind
        cwd.mkdir()
        proc = subprocess.Popen(
            [sys.executable, "-m", "drivebench", *args, f"hydra.run.dir={cwd / 'run'}"], cwd=cwd,
            env=drivebench.env(cwd, {**fault, **extra}), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        lines: list[tuple[float, str]] = []
        runs[kind] = (proc, lines, [_timed_lines(proc.stdout, []), _timed_lines(proc.stderr, lines)])

    outcome = {}

    def finish(kind: str) -> None:
        proc, lines, pumps = runs[kind]
        proc.wait(timeout=240)
        for pump in pumps:  # until every rank has closed the pipes (rank 1 outlives rank 0)
            pump.join(timeout=150)
        assert not any(pump.is_alive() for pump in pumps), f"a rank of the {kind} run still holds its pipes"
        ended = lines[-1][0]  # when the stderr pipe closed, however late this finish() came
        fault_at = next((t for t, line in lines if "drivebench: fault injection: rank" in line), None)
        assert fault_at is not None, "".join(line for _, line in lines)[-3000:]
        outcome[kind] = (proc.returncode, "".join(line for _, line in lines), ended - fault_at, proc.pid)

    start("dead", {})
    start("stuck", {"DRIVEBENCH_FAULT_HANG": "1"})
    finish("dead")
    start("rank0", {"DRIVEBENCH_FAULT_EXIT_RANK": "0"})  # while the stuck run waits out its timeout
    finish("stuck")
    finish("rank0")

    code, err, after_fault, _ = outcome["dead"]
    assert code != 0 and "fault injection: rank 1 exits abruptly" in err
    last = [line for line in err.splitlines() if line.strip()][-2:]
    assert any("rank 1 (pid " in line and f"exited with code {FAULT_EXIT_CODE}" in line for line in last), last
    assert after_fault < after_fault_s  # gloo notices the closed connection at once; the timeout is the bound

    code, err, after_fault, _ = outcome["stuck"]
    assert code != 0 and "fault injection: rank 1 stops responding" in err
    assert "rank 1 (pid " in err and "dist.timeout_minutes" in err and "timeout" in err.lower()
    assert after_fault < after_fault_s  # the timeout after the fault: not more

    code, err, after_fault, rank0_pid = outcome["rank0"]  # the process started here is rank 0
    assert code == FAULT_EXIT_CODE and "fault injection: rank 0 exits abruptly" in err, err[-3000:]
    (line,) = [x for x in err.splitlines() if x.startswith("drivebench: error:")]  # rank 1's, one line
    assert line.startswith(f"drivebench: error: rank 0 (pid {rank0_pid}, the process that launched this one) "
                           "ended during the run"), line
    assert line.endswith("rank 1 stopped because its peer is gone") and "Traceback" not in err, err[-3000:]
    assert after_fault < after_fault_s  # rank 1 notices in its next collective, or its watch does after 10 s

    # no result left behind: the summary written when training started says failed where rank 0 saw the fault,
    # and still says running where rank 0 itself ended abruptly (the report lists that run as died)
    statuses = {p.parts[-3]: json.loads(p.read_text())["run"]["status"] for p in summaries(tmp_path)}
    assert statuses == {"dead": "failed", "stuck": "failed", "rank0": "running"}, statuses
    left = [p for p in psutil.process_iter(["cmdline"]) if str(tmp_path) in " ".join(p.info["cmdline"] or [])]
    assert not left, "a rank process outlived its run"


def test_command_line_local_rank_forms_and_dist_errors(drivebench, tmp_path):
    """Side by side (they are mostly start-up time): a single-process run given the legacy local rank
    both as a flag and as LOCAL_RANK; the other flag forms removed before Hydra; two bad dist settings."""
    quiet = {k: v for k, v in drivebench.env(tmp_path).items() if k != "DRIVEBENCH_TEST_PROBE"}  # no probe: faster

    def start(args: list[str], env: dict[str, str]) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "drivebench", *args], cwd=tmp_path, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    run_dir = tmp_path / "single"
    single = start(["--local_rank=0", *RUN, "trainer.max_steps=3", f"hydra.run.dir={run_dir}"],
                   {**quiet, "LOCAL_RANK": "0"})
    # the other forms in one command line: each is removed, or Hydra would reject the command
    forms = start(["--local-rank", "0", *RUN[:2], "--local_rank", "0", *RUN[2:], "--local-rank=0", "--cfg", "job"],
                  quiet)
    errors = {"dist.backend=nccl": "drivebench: error: dist.backend=nccl needs GPUs but this run is on the CPU",
              "dist.p2p=maybe": "drivebench: error: dist.p2p='maybe' is not valid; choose one of: auto, on, off"}
    failing = {case: start([*RUN, *DDP, case, f"hydra.run.dir={tmp_path / f'bad{i}'}"], quiet)
               for i, case in enumerate(errors)}

    out, err = forms.communicate(timeout=120)
    assert forms.returncode == 0, err[-2000:]
    assert "name: maptr" in out and "size: test" in out
    for case, proc in failing.items():
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 2, err[-2000:]
        assert err.strip().splitlines()[-1].startswith(errors[case])  # one line, the last one
    _, err = single.communicate(timeout=180)
    assert single.returncode == 0, err[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["train"]["samples"] > 0 and "ranks" not in summary
    assert "--local" not in summary["run"]["command"]  # the flag was removed before Hydra parsed argv
    assert summaries(tmp_path) == [run_dir / "summary.json"]
