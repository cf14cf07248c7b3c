"""accel=auto: the trial picks by measuring, records what failed, and stays inside its budget.

Real trials on the CPU: MapTR at test size on the mini set, its camera pipeline followed by a step
that sleeps (a slow loader: workers must win) or that raises inside loader workers (every worker
candidate fails). The decision rules (margin, order, budget accounting) are also checked on their own
with a measuring function that reports fixed step times, which no real machine would hold still.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from drivebench.accel.autotune import (CUT, FAILED, IN_RUN, OK, SKIPPED, Capabilities, Measurement, Stage, Trial, choose,
                                       plan_stages, search, search_steps, worker_counts)
from drivebench.app import build_run
from drivebench.bench.autotune import AccelTrial, render_trials
from drivebench.errors import ConfigError

CONF = Path(__file__).resolve().parents[1] / "drivebench" / "conf"
CPU_CAPS = Capabilities(on_gpu=False, cpu_cores=2, cores_per_device=2, bf16=False, device_transform=True,
                        compile_units=1, cuda_graphs="no CUDA device", convolutions=True, worker_cap=2)
GPU_CAPS = Capabilities(on_gpu=True, cpu_cores=32, cores_per_device=16, bf16=True, device_transform=False,
                        compile_units=0, cuda_graphs="", convolutions=False, worker_cap=16)


# ---- the decision rules -------------------------------------------------------------------------------
def _fixed(times: dict, wait: dict | None = None, fail: set = frozenset(), cost: float = 1.0,
           knob: str = "num_workers", h2d: float = 0.0):
    """measure(): step time by the value of ``knob`` (what a table of past measurements would say)."""
    calls = []

    def measure(setting, seconds_left, stop_above_s=None):
        n = setting[knob]
        calls.append((n, seconds_left))
        if n in fail:
            return Measurement(error="RuntimeError: boom", steps_wanted=4, cost_s=cost)
        return Measurement(steps_measured=4, steps_wanted=4, step_s={"median": times[n], "p10": times[n], "p90": times[n]},
                           data_wait_fraction=(wait or {}).get(n, 0.5), h2d_fraction=h2d, cost_s=cost)
    return measure, calls


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_choose_keeps_the_first_setting_within_the_margin_and_never_a_failed_one():
    def trial(change, median, status=OK):
        return Trial(stage="s", change=change, setting={}, status=status, step_s_median=median)
    trials = [trial("a", 1.00), trial("b", 0.97), trial("c", 0.50, FAILED), trial("d", 0.96), trial("e", 0.40, CUT)]
    assert choose(trials, margin=0.05).change == "a"   # 1.00 <= 0.96 * 1.05
    assert choose(trials, margin=0.02).change == "b"   # 0.97 <= 0.96 * 1.02, 1.00 is not
    assert choose([trial("x", None, FAILED)], 0.05) is None


def test_worker_stage_tries_the_most_then_goes_down_to_the_fewest_as_fast():
    stages, _ = plan_stages(GPU_CAPS, auto_numerics=False)
    assert stages[0].knob == "num_workers" and stages[0].values == (0, 1, 2, 4, 8, 16) == worker_counts(16)
    measure, calls = _fixed({0: 1.0, 1: 0.6, 2: 0.4, 4: 0.30, 8: 0.29, 16: 0.29})
    result = search({"num_workers": 0}, stages[:1], measure, budget_s=100, margin=0.05)
    assert [n for n, _ in calls] == [0, 16, 8, 4, 2]   # 2 is slower than the best: 1 is not tried
    assert result.chosen == {"num_workers": 4}          # the fewest within 5% of the fastest (0.29)
    assert "smaller values not tried" in result.trials[-1].reason
    assert [t.chosen for t in result.trials] == [False, False, False, True, False]
    # a loader that keeps up with none: the largest count is no faster, nothing in between is tried
    measure, calls = _fixed({0: 0.30, 16: 0.30})
    result = search({"num_workers": 0}, stages[:1], measure, budget_s=100, margin=0.05)
    assert [n for n, _ in calls] == [0, 16] and result.chosen == {"num_workers": 0}


def test_an_incumbent_count_between_the_listed_ones_is_simpler_than_the_larger_count():
    # an incumbent count that is not one of the listed counts (num_workers: auto resolves to the cores
    # left beside training) ranks in size order: 16 measuring the same (inside the margin) must not
    # replace 12 (seen on the H200, 2026-12-02: 16 chosen at 319.8 ms over 15's 315.3 ms)
    stages, _ = plan_stages(GPU_CAPS, auto_numerics=False)
    measure, calls = _fixed({12: 0.3153, 16: 0.3198})
    result = search({"num_workers": 12}, stages[:1], measure, budget_s=100, margin=0.05)
    assert [n for n, _ in calls] == [12, 16] and result.chosen == {"num_workers": 12}
    measure, calls = _fixed({12: 0.40, 16: 0.30, 8: 0.45})
    assert search({"num_workers": 12}, stages[:1], measure, budget_s=100, margin=0.05).chosen == {"num_workers": 16}


def test_a_largest_count_within_twice_the_margin_of_the_incumbent_is_not_tried():
    # num_workers: auto is 15 on a 16-core H200: one more worker cannot save 5% of a step, and its trial
    # cost 7-38 s there (2026-12-02)
    stages, _ = plan_stages(GPU_CAPS, auto_numerics=False)
    measure, calls = _fixed({15: 0.30, 16: 0.10, 8: 0.05})
    result = search({"num_workers": 15}, stages[:1], measure, budget_s=100, margin=0.05)
    assert [n for n, _ in calls] == [15] and result.chosen == {"num_workers": 15}
    skipped = result.trials[-1]
    assert skipped.status == SKIPPED and skipped.change == "num_workers=16" and "within 10%" in skipped.reason
    assert not skipped.chosen
    # farther apart (8 against 16), or from no workers, the count is tried as before
    measure, calls = _fixed({8: 0.30, 16: 0.20, 4: 0.5})
    assert search({"num_workers": 8}, stages[:1], measure, budget_s=100, margin=0.05).chosen == {"num_workers": 16}
    measure, calls = _fixed({15: 0.30, 16: 0.10, 8: 0.40})
    assert search({"num_workers": 15}, stages[:1], measure, budget_s=100, margin=0.25).trials[-1].status == SKIPPED
    assert search({"num_workers": 15}, stages[:1], measure, budget_s=100, margin=0.02).chosen == {"num_workers": 16}


def test_loader_pipeline_knobs_keep_the_deeper_pipeline_unless_a_shallower_one_is_faster():
    """Pinned memory and the device transform: the trial's eager steps are slower than the run's compiled
    ones (QCNet on the H200: 140 ms against 67 ms), so a shallower pipeline that only ties in the trial
    would fall behind in the run; it replaces the deeper one only when faster by the margin."""
    caps = Capabilities(**{**GPU_CAPS.__dict__, "device_transform": True})
    stages = {s.knob: s for s in plan_stages(caps, auto_numerics=False)[0]}
    assert stages["pin_memory"].values[0] is True and stages["device_transform"].values[0] == "decode"

    def measure_by(knob, times):  # the copy to the device is a fifth of the step: the pin stage runs
        return _fixed(times, knob=knob, h2d=0.2)

    measure, calls = measure_by("pin_memory", {True: 0.100, False: 0.098})
    assert search({"pin_memory": True}, [stages["pin_memory"]], measure, 100, 0.05).chosen == {"pin_memory": True}
    assert [v for v, _ in calls] == [True, False]
    measure, _ = measure_by("pin_memory", {True: 0.100, False: 0.090})
    assert search({"pin_memory": True}, [stages["pin_memory"]], measure, 100, 0.05).chosen == {"pin_memory": False}
    # from an unpinned start (accel=auto accel.pin_memory=false), pinning that ties is still preferred
    measure, _ = measure_by("pin_memory", {True: 0.100, False: 0.099})
    assert search({"pin_memory": False}, [stages["pin_memory"]], measure, 100, 0.05).chosen == {"pin_memory": True}
    measure, calls = measure_by("device_transform", {"decode": 0.30, "images": 0.29, "off": 0.29})
    result = search({"device_transform": "decode"}, [stages["device_transform"]], measure, 100, 0.05)
    assert result.chosen == {"device_transform": "decode"} and [v for v, _ in calls] == ["decode", "images", "off"]
    measure, _ = measure_by("device_transform", {"decode": 0.30, "images": 0.31, "off": 0.20})
    assert search({"device_transform": "decode"}, [stages["device_transform"]], measure, 100,
                  0.05).chosen == {"device_transform": "off"}


def test_compute_knobs_keep_max_values_unless_measurably_slower():
    """The trial's eager steps cannot show what TF32 or cuDNN autotuning do in the compiled run (MapTR on the
    H200, 2026-12-03: timed 4.6% and 2.5% slower in the trial; max, with them, stepped 127 ms against auto's
    145 ms without): a difference inside the margin keeps max's value; a measurable loss gives it up."""
    caps = Capabilities(**{**GPU_CAPS.__dict__, "convolutions": True})
    stages = {s.knob: s for s in plan_stages(caps, auto_numerics=True)[0]}
    assert [stages[k].values[0] for k in ("cuda_graphs", "precision", "tf32", "channels_last",
                                          "fused_optimizer")] == ["on", "bf16-mixed", True, True, True]
    for knob in ("tf32", "channels_last"):
        measure, calls = _fixed({False: 0.1766, True: 0.1847}, knob=knob)   # 4.6% slower: inside 5%
        assert search({knob: False}, [stages[knob]], measure, 100, 0.05).chosen == {knob: True}
        assert [v for v, _ in calls] == [False, True]
        measure, _ = _fixed({False: 0.1766, True: 0.1950}, knob=knob)      # 10% slower: given up
        assert search({knob: False}, [stages[knob]], measure, 100, 0.05).chosen == {knob: False}
    measure, _ = _fixed({"off": 0.190, "on": 0.196}, knob="cuda_graphs")
    assert search({"cuda_graphs": "off"}, [stages["cuda_graphs"]], measure, 100, 0.05).chosen == {"cuda_graphs": "on"}
    # on a CPU-only machine max computes in fp32: bf16 that ties does not replace it
    cpu = {s.knob: s for s in plan_stages(CPU_CAPS, auto_numerics=True)[0]}
    measure, _ = _fixed({"32-true": 0.50, "bf16-mixed": 0.49}, knob="precision")
    assert search({"precision": "32-true"}, [cpu["precision"]], measure, 100, 0.05).chosen == {"precision": "32-true"}
    # activation checkpointing keeps upstream's recomputation unless dropping it is faster by the margin
    ckpt = next(s for s in plan_stages(Capabilities(**{**GPU_CAPS.__dict__, "checkpointed": True}), False)[0]
                if s.knob == "activation_checkpointing")
    measure, _ = _fixed({"keep": 0.30, "off": 0.29}, knob="activation_checkpointing")
    assert search({"activation_checkpointing": "keep"}, [ckpt], measure, 100, 0.05).chosen == {"activation_checkpointing": "keep"}


def test_a_failed_candidate_is_recorded_and_the_search_goes_on():
    measure, _ = _fixed({0: 1.0, 1: 0.9, 2: 0.5}, fail={1})
    result = search({"num_workers": 0}, [Stage("num_workers", (0, 1, 2), bound_by="data_wait", ordered=True)],
                    measure, budget_s=100, margin=0.05)
    rows = {t.change: t for t in result.trials}
    assert rows["num_workers=1"].status == FAILED and rows["num_workers=1"].reason == "RuntimeError: boom"
    assert result.chosen == {"num_workers": 2} and not rows["num_workers=1"].chosen


def test_the_budget_stops_the_search_and_names_what_it_left_out():
    clock = FakeClock()
    measure, calls = _fixed({0: 1.0, 1: 0.9, 2: 0.8, 4: 0.7}, cost=4.0)

    def timed(setting, left, stop_above_s=None):
        clock.now += 4.0  # every trial costs 4 s
        return measure(setting, left)
    stages = [Stage("num_workers", (0, 1, 2, 4), bound_by="data_wait", ordered=True), Stage("pin_memory", (False, True))]
    result = search({"num_workers": 0, "pin_memory": False}, stages, timed, budget_s=9.5, margin=0.05, clock=clock)
    # trials start at 0 s and 4 s; at 8 s only 1.5 s are left, under half a trial's cost: nothing else starts
    assert [n for n, _ in calls] == [0, 4] and result.stopped_by_budget and result.cost_s == 8.0
    assert calls[1][1] == pytest.approx(5.5)   # the running trial is told what is left
    skipped = [t for t in result.trials if t.status == SKIPPED]
    assert skipped[0].change == "num_workers=2" and "budget" in skipped[0].reason
    assert any(t.stage == "pin_memory" and "budget" in t.reason for t in skipped)
    assert result.chosen == {"num_workers": 4, "pin_memory": False}


def _drive(steps, measure):
    """Run a ``search_steps`` generator to its end, as the run's training loop does one segment at a time."""
    requests = []
    try:
        request = next(steps)
        while True:
            requests.append(request)
            request = steps.send(measure(request))
    except StopIteration as done:
        return done.value, requests


def test_segments_charged_by_their_cost_all_run_where_their_wall_time_would_spend_the_budget():
    """b39 (SparseDrive, H200): segments of ~1-s steps spent the 60-s budget by wall time while costing 5 s, and
    the search never reached bf16. Charged by cost, equal-speed segments cost nothing and every stage runs;
    the wall clock would have stopped it after the second."""
    stages = [Stage("num_workers", (0, 4)), Stage("pin_memory", (False, True)), Stage("tf32", (False, True))]
    base = {"num_workers": 0, "pin_memory": False, "tf32": False}
    for charge, tried in (("cost", 4), ("wall", 2)):
        clock = FakeClock()

        def measure(request, clock=clock):
            clock.now += 20.0  # every segment takes 20 s of the run's own steps, at the same speed
            return Measurement(steps_measured=4, steps_wanted=4, step_s={"median": 1.0, "p10": 1.0, "p90": 1.0},
                               data_wait_fraction=0.0, cost_s=0.5 if request.reference_s else 0.0)
        steps = search_steps(base, stages, 30.0, 0.05, clock=clock, where="run", charge=charge)
        result, requests = _drive(steps, measure)
        assert len(requests) == tried, charge
        assert result.stopped_by_budget is (charge == "wall")
    # the segments are told the incumbent's median to count their cost against (none for the base)
    assert requests[0].reference_s is None and requests[1].reference_s == 1.0


def test_charged_by_cost_the_base_is_measured_even_with_no_budget_left_and_nothing_else_is():
    stages = [Stage("tf32", (False, True))]
    result, requests = _drive(search_steps({"tf32": False}, stages, 0.0, 0.05, where="run", charge="cost"),
                              lambda request: Measurement(steps_measured=4, steps_wanted=4, step_s={"median": 1.0},
                                                          cost_s=0.0))
    assert len(requests) == 1 and result.stopped_by_budget
    assert [t.status for t in result.trials] == [OK, SKIPPED] and result.chosen == {"tf32": False}
    with pytest.raises(ValueError, match="charge"):
        next(search_steps({}, stages, 1.0, 0.05, charge="steps"))


def test_stages_follow_the_machine_the_model_and_auto_numerics():
    cpu, cpu_not = plan_stages(CPU_CAPS, auto_numerics=False)
    assert [s.knob for s in cpu] == ["num_workers", "prefetch_factor"]
    reasons = {n["stage"]: n["reason"] for n in cpu_not}
    assert "auto_numerics=false" in reasons["precision"] and "CUDA" in reasons["pin_memory"]
    assert "CPU compile" in reasons["compile"]
    cpu_numerics, _ = plan_stages(CPU_CAPS, auto_numerics=True)
    assert "precision" in [s.knob for s in cpu_numerics] and "tf32" not in [s.knob for s in cpu_numerics]
    gpu, gpu_not = plan_stages(GPU_CAPS, auto_numerics=True)
    knobs = [s.knob for s in gpu]
    assert knobs.index("num_workers") < knobs.index("cuda_graphs") < knobs.index("precision") < knobs.index("tf32")
    assert {n["stage"] for n in gpu_not} == {"device_transform", "compile", "activation_checkpointing",
                                             "channels_last", "cudnn_benchmark"}
    checkpointed, _ = plan_stages(Capabilities(**{**GPU_CAPS.__dict__, "checkpointed": True}), auto_numerics=False)
    ckpt = next(s for s in checkpointed if s.knob == "activation_checkpointing")
    assert ckpt.values == ("keep", "off") and not ckpt.live  # not known to fit: short fits
    fits, _ = plan_stages(Capabilities(**{**GPU_CAPS.__dict__, "checkpointed": True, "checkpointing_live": ""}), False)
    assert next(s for s in fits if s.knob == "activation_checkpointing").live  # on the run's own steps


def _auto_accel(gpus: int):
    """``accel=auto`` as configured, resolved on a 16-core machine with ``gpus`` H100s (0: CPU only)."""
    from drivebench.accel.settings import AccelSettings
    from drivebench.perf.machine import GPUInfo, MachineInfo

    machine = MachineInfo(hostname="h", cpu_model="x", cpu_cores=16, ram_gb=128, shm_gb=64, shm_free_gb=60,
                          accelerator="cuda" if gpus else "cpu",
                          gpus=[GPUInfo(i, "NVIDIA H100", 80.0, "9.0") for i in range(gpus)], bf16_supported=bool(gpus))
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        accel_cfg = OmegaConf.to_container(compose(config_name="config", overrides=["accel=auto"]).accel, resolve=True)
    return AccelSettings.resolve(accel_cfg, machine)


def test_cudnn_autotuning_is_not_timed_and_auto_starts_with_maxs_value():
    """PyTorch keeps the cuDNN plan a convolution first ran with, whatever the autotuning flag (its plan cache's key
    has no such field), so a switch inside the process times nothing: b41's GaussianFormer trial chose it on
    plans its base had picked by heuristics and its compiled run kept them. accel=auto starts where max does."""
    from drivebench.accel.autotune import CUDNN_PLAN_CACHE

    planned, not_allowed = plan_stages(Capabilities(**{**GPU_CAPS.__dict__, "convolutions": True}), auto_numerics=True)
    assert "cudnn_benchmark" not in [s.knob for s in planned]
    assert {n["stage"]: n["reason"] for n in not_allowed}["cudnn_benchmark"] == CUDNN_PLAN_CACHE
    for gpus, expected in ((1, True), (0, False)):
        assert _auto_accel(gpus).cudnn_benchmark is expected


def test_checkpointing_is_live_only_where_dropping_it_fits_the_device():
    """``activation_checkpointing=auto``'s rule decides: SparseDrive's measured activations (test size, batch 6)
    within 25% of a GPU's memory -> live; a GPU four times the saving -> short fits; no GPU, no checkpointing, or a
    knob resolved at build time -> short fits, each with its reason."""
    from types import SimpleNamespace

    from drivebench.accel.settings import checkpointing_off_fits
    from drivebench.bench.autotune import checkpointing_live
    from drivebench.perf.machine import GPUInfo, MachineInfo
    from drivebench.models import create_model

    def gpu(memory_gb):
        return MachineInfo(hostname="h", cpu_model="x", cpu_cores=16, ram_gb=64, shm_gb=32, shm_free_gb=30,
                           accelerator="cuda", gpus=[GPUInfo(0, "GPU", memory_gb, "9.0")], bf16_supported=True)

    net = create_model("sparsedrive", "test")  # upstream: with_cp=True

    def run(machine, knob="keep", default=True):
        return SimpleNamespace(activation_checkpointing={"model_default": default}, accel=SimpleNamespace(
            activation_checkpointing=knob), module=SimpleNamespace(net=net), machine=machine)

    assert checkpointing_live(run(gpu(139.0)), 6) == ""
    _, _, measured = checkpointing_off_fits(net, gpu(139.0), 6)
    assert "exceed 25% of device memory" in checkpointing_live(run(gpu(measured["saved_gib_estimate"] * 2)), 6)
    cpu = MachineInfo(hostname="h", cpu_model="x", cpu_cores=2, ram_gb=64, shm_gb=32, shm_free_gb=30, accelerator="cpu")
    assert checkpointing_live(run(cpu), 6) == "not a CUDA device"
    assert "does not checkpoint" in checkpointing_live(run(gpu(139.0), default=False), 6)
    assert "resolved when the run is built" in checkpointing_live(run(gpu(139.0), knob="auto"), 6)
    assert net.encoder.backbone.activation_checkpointing  # measuring switched nothing


# ---- real trials on the CPU ---------------------------------------------------------------------------
def _cfg(cache: Path, tmp_path: Path, *overrides: str, sleep_s: float = 0.0, fail_in_workers: bool = False,
         accel: str = "auto", run_dir: str = "run"):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[
            "model=maptr", f"accel={accel}", "ckpt=none", f"paths.cache={cache}", f"paths.output_dir={tmp_path / run_dir}",
            "model.batch_size=2", "model.val_batch_size=2", "accel.auto_steps=4", "accel.auto_warmup_steps=2",
            *overrides])
    inner = OmegaConf.to_container(cfg.model.transform)
    cfg.model.transform = {"_target_": "slow_loader.SlowCameraPipeline", "inner": inner, "sleep_s": sleep_s,
                           "fail_in_workers": fail_in_workers}
    return cfg


def _trial(cfg, tmp_path):
    printed = []
    trial = AccelTrial(cfg, tmp_path / "run", build_run, report=printed.append)
    return trial, trial.run(), printed


def test_with_a_slow_loader_the_trial_picks_loader_workers(drivebench_cache, tmp_path):
    # 0.15 s per sample in the loader, 0.3 s per batch of 2: more than MapTR test computes per step here
    trial, block, printed = _trial(_cfg(drivebench_cache, tmp_path, "accel.num_workers=0", sleep_s=0.15), tmp_path)
    rows = block["trials"]
    base = rows[0]
    assert base["change"] == "base" and base["setting"]["num_workers"] == 0 and base["status"] == OK
    # the loader bounds the base: its wait is well over the margin, so the worker stage is tried (the trial tries it
    # above 1x the margin; MapTR's own compute per step grows on a busy box: 0.294 on a slower 2-core box, 0.193 in a
    # clean-clone CI run beside the other tests, so 4x the margin was a bound on the machine, not on the trial)
    assert base["data_wait_fraction"] > 2 * block["margin"]
    assert trial.chosen["num_workers"] >= 1 and block["changed"]["num_workers"] == trial.chosen["num_workers"], render_trials(block)
    winner = next(r for r in rows if r["chosen"])
    assert winner["step_s_median"] < base["step_s_median"] / (1 + block["margin"])
    # every completed row measured its 4 steps, or stopped after 3 as far slower than the incumbent
    assert all(r["steps_measured"] == 4 or (r["steps_measured"] == 3 and "stopped after 3" in r["reason"])
               for r in rows if r["status"] == OK), render_trials(block)
    assert printed and "num_workers=" in printed[0] and "<- chosen" in printed[0]
    # each candidate's cost is split into its parts, which add up to it; the slow loader shows in its steps
    for row in (r for r in rows if r["status"] == OK):
        split = row["cost_split"]
        assert list(split) == ["build", "start", "warmup", "steps", "end", "teardown"], split
        assert min(split.values()) >= 0 and sum(split.values()) == pytest.approx(row["cost_s"], abs=0.05)
        # the measured steps' wall time holds them all: at least half last the median or longer (one step stalled
        # on a busy box lifts the sum far above median x steps, 5.1 s against 2.2 under a parallel test run)
        assert split["steps"] >= 0.95 * row["step_s_median"] * math.ceil(row["steps_measured"] / 2), split
        assert len(row["warmup_steps_s"]) == block["warmup_steps"]
        assert sum(step for step, _ in row["warmup_steps_s"]) == pytest.approx(split["warmup"], abs=0.01)
        assert all(0 <= wait <= step for step, wait in row["warmup_steps_s"])
    # the base loads in the main process: every measured step waits out the loader's 0.3 s per batch
    assert rows[0]["cost_split"]["steps"] >= 0.3 * rows[0]["steps_measured"], rows[0]["cost_split"]
    assert rows[0]["cost_split"]["build"] == 0.0  # the base candidate was built with the run's data preparation
    assert block["cost_split"]["steps"] == pytest.approx(sum(r["cost_split"]["steps"] for r in rows if r["cost_split"]))
    assert "the candidates' cost: build" in printed[0]
    # every candidate built after the base decoded no image: the base's shared-memory image cache served it
    built = [r for r in rows[1:] if r["status"] in (OK, FAILED, CUT)]
    assert built and block["image_cache_reused"] == len(built), render_trials(block)
    assert not (tmp_path / "run" / "autotune").exists()   # trials leave nothing in the run directory


def test_candidates_with_the_same_loader_share_its_running_workers(drivebench_cache, tmp_path):
    """Starting many loader workers beside a large process costs seconds per candidate (fork copies its page
    tables: 15 workers beside 8 GB took 4-5 s to a first batch on the 2-core CPU). A candidate that differs
    from the previous one only in step-side knobs takes over its running training stream, rewound to the
    first batch; one with other loader settings starts its own, and the old workers stop."""
    cfg = _cfg(drivebench_cache, tmp_path, "accel.num_workers=1", "accel.persistent_workers=true")
    trial = AccelTrial(cfg, tmp_path / "run", build_run, report=lambda text: None)
    base = {"num_workers": 1, "prefetch_factor": 4, "precision": "32-true"}
    first = trial.measure(dict(base), 300.0)
    key, stream = trial._live
    workers, after_first = list(stream.loader._iterator._workers), stream.position
    assert first.error is None and first.steps_measured == 4 and all(w.is_alive() for w in workers)
    second = trial.measure({**base, "precision": "bf16-mixed"}, 300.0)  # a step-only knob: same loader
    assert second.error is None and second.steps_measured == 4 and trial.loader_reused == 1
    assert trial._live[0] == key and trial._live[1] is stream
    assert list(stream.loader._iterator._workers) == workers and all(w.is_alive() for w in workers)
    # rewound: the second candidate trained on the same batches from the start, so it stands where the first stood
    assert stream.position == after_first
    third = trial.measure({**base, "prefetch_factor": 2}, 300.0)  # another loader: its own workers
    assert third.error is None and trial.loader_reused == 1 and trial._live[1] is not stream
    assert not any(w.is_alive() for w in workers)
    newer = list(trial._live[1].loader._iterator._workers)
    trial.close()
    assert trial._live is None and not any(w.is_alive() for w in newer)


def test_a_failing_candidate_is_skipped_with_its_error_recorded(drivebench_cache, tmp_path):
    trial, block, _ = _trial(_cfg(drivebench_cache, tmp_path, "accel.num_workers=0", sleep_s=0.15,
                                  fail_in_workers=True), tmp_path)
    failed = [r for r in block["trials"] if r["status"] == FAILED]
    assert failed and all(r["setting"]["num_workers"] > 0 for r in failed), render_trials(block)
    assert all("cannot run in a loader worker" in r["reason"] for r in failed)
    assert trial.chosen["num_workers"] == 0 and not any(r["chosen"] for r in failed)
    assert any(r["stage"] == "prefetch_factor" and r["status"] == SKIPPED for r in block["trials"])


def test_the_budget_bounds_the_trial(drivebench_cache, tmp_path):
    budget = 6.0
    cfg = _cfg(drivebench_cache, tmp_path, f"accel.auto_budget_s={budget}", sleep_s=0.2)
    trial, block, _ = _trial(cfg, tmp_path)
    rows = block["trials"]
    assert block["stopped_by_budget"] and block["cost_s"] == pytest.approx(sum(r["cost_s"] for r in rows), abs=1.0)
    slowest_step = max((r["step_s_p90"] or 0.0) for r in rows)
    # a running trial stops at the first step end past the budget, then tears down
    assert block["cost_s"] <= budget + slowest_step + 3.0, render_trials(block)
    assert any(r["status"] in (CUT, SKIPPED) and "budget" in (r["reason"] or "") for r in rows)
    assert not any(r["chosen"] and r["status"] != OK for r in rows)


def test_auto_refuses_several_processes(drivebench_cache, tmp_path):
    cfg = _cfg(drivebench_cache, tmp_path, "dist=ddp")
    with pytest.raises(ConfigError, match="dist=single, or run bench=autotune"):
        AccelTrial(cfg, tmp_path, build_run)


def test_accel_auto_trains_with_the_choice_and_bench_autotune_only_tunes(drivebench_cache, tmp_path, capsys):
    from drivebench.app import main

    cfg = _cfg(drivebench_cache, tmp_path, "bench.steps=3", "bench.warmup_steps=1", "bench.ceiling=false",
               "bench.val_batches=0", "~logger", "accel.auto_budget_s=10", sleep_s=0.15)
    summary = main(cfg)
    out = capsys.readouterr().out
    trial = summary["autotune"]
    assert "accel trial (auto)" in out and "accel trial (accel=auto)" in out
    for knob, value in trial["chosen"].items():
        assert summary["settings"]["accel"][knob] == value, knob
    assert summary["settings"]["accel"]["auto_trial"] is True and summary["train"]["steps_total"] == 4
    assert 0 < trial["cost_fraction_of_run"] < 1 and trial["cost_s"] <= trial["budget_s"] + 5
    written = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert written["autotune"]["trials"] == trial["trials"]
    from drivebench.report.cli import main as report
    import pandas as pd

    assert report([str(tmp_path / "run"), "--out", str(tmp_path / "report")]) == 0
    row = pd.read_csv(tmp_path / "report" / "report.csv").iloc[0]
    assert row["autotune_cost_s"] == pytest.approx(trial["cost_s"]) and row["setting"] == "auto"
    assert "accel trial (cost: chose)" in (tmp_path / "report" / "report.md").read_text()

    only = _cfg(drivebench_cache, tmp_path, "bench=autotune", "~logger", "accel.auto_budget_s=5",
                accel="none", run_dir="only")
    tuned = main(only)
    assert tuned["run"]["bench"] == "autotune" and "train" not in tuned and tuned["autotune"]["preset"] == "none"
    assert tuned["autotune"]["trials"][0]["setting"]["num_workers"] == 0
    assert math.isfinite(tuned["autotune"]["cost_s"])


def test_an_interrupted_run_keeps_the_trial_table_in_its_summary(tmp_path):
    """A run stopped by a signal after its trial (a scheduler's SIGTERM mid-training) still records the
    trial in ``summary.json``: the H200 run of 2026-12-02 printed the table, then wrote a summary without it."""
    import signal
    import time
    from types import SimpleNamespace

    from drivebench.bench.runners import TrainBench

    table = {"rows": [{"stage": "base", "status": OK}], "chosen": {"num_workers": 8}, "cost_s": 12.0}
    cfg = OmegaConf.create({"requeue": False, "ckpt": {"callback": None}})
    run = SimpleNamespace(cfg=cfg, output_dir=tmp_path, started=time.time() - 120.0, autotune=table)
    bench = TrainBench()
    bench.stopped, bench._trainer, bench._phase = None, None, "training"
    summary = {"run": {}, "paths": {}}
    stop = bench._interrupted(run, None, summary, signal.SIGTERM)
    written = json.loads((tmp_path / "summary.json").read_text())
    assert written["run"]["status"] == "interrupted" and "status interrupted" in stop.message
    assert written["autotune"]["chosen"] == {"num_workers": 8}
    assert 0.09 < written["autotune"]["cost_fraction_of_run"] < 0.11  # 12 s of a ~120 s run


def test_a_completed_auto_run_records_and_is_advised_on_the_settings_the_trial_chose(tmp_path):
    """The summary's settings, its checkpointing record and its bottleneck advice all follow the trial's choice:
    an H100 run of 2026-12-05 (GaussianFormer) trained in bf16, compiled, checkpointing off, and its summary said
    checkpointing was on and advised bf16 and compile."""
    import time
    from types import SimpleNamespace

    from drivebench.bench.runners import TrainBench, _adopt_live_knobs

    accel = _auto_accel(1)
    assert accel.precision == "32-true"  # where the trial starts without accel.auto_numerics
    started_with = {"knob": "keep", "enabled": True, "reason": "model.net.activation_checkpointing (upstream's setting)"}
    run = SimpleNamespace(accel=accel, activation_checkpointing=dict(started_with), fused_optimizer="off",
                          compiled_units=[], module=SimpleNamespace(summary_settings=dict, graphed_loss=None),
                          datamodule=SimpleNamespace(device_transform=None, transform=None), threads=None,
                          started=time.time() - 200.0, cuda_graphs="off")
    summary = {"run": {"bench": "train"}, "paths": {}, "machine": {"accelerator": "cuda", "cpu_cores": 16},
               "settings": {"accel": accel.to_dict(), "activation_checkpointing": run.activation_checkpointing,
                            "cuda_graphs": {"status": "off"}},
               "train": {"steps_measured": 60, "wall_s": 24.0, "data_wait_fraction": 0.001,
                         "loop_overhead_fraction": 0.12, "step_s": {"median": 0.39, "p10": 0.36, "p90": 0.43},
                         "system": {"gpu_util_pct": {"median": 95.0}}}}
    live = {"precision": "bf16-mixed", "tf32": True, "channels_last": True, "cudnn_benchmark": True,
            "activation_checkpointing": "off", "cuda_graphs": "off"}
    _adopt_live_knobs(run, live)  # what the trial's on_chosen does when its segments end
    run.autotune = {"cost_s": 15.0, "eager_choice": dict(live), "chosen": {**live, "compile": True},
                    "compile_in_run": {"judged": True, "kept": True, "judged_at_step": 110}, "in_run_trial": {"segments": 6}}
    TrainBench()._complete(run, summary)
    trained = summary["settings"]
    assert trained["accel"]["precision"] == "bf16-mixed" and trained["accel"]["compile"] is True
    assert trained["activation_checkpointing"]["enabled"] is False, trained["activation_checkpointing"]
    assert "accel=auto" in trained["activation_checkpointing"]["reason"]
    assert summary["bottleneck"]["verdict"] == "device compute"
    assert "bf16" not in summary["bottleneck"]["next"] and "compile" not in summary["bottleneck"]["next"], summary["bottleneck"]
    assert summary["run"]["status"] == "completed" and 0.05 < summary["autotune"]["cost_fraction_of_run"] < 0.1


# ---- early stop of a far slower candidate; compile judged on the run's own steps ----------------------
def test_a_far_slower_candidate_stops_early_and_is_not_cut_or_chosen():
    from drivebench.accel.autotune import SLOWER_STOP

    seen = []

    def measure(setting, seconds_left, stop_above_s=None):
        n = setting["num_workers"]
        seen.append((n, stop_above_s))
        slow = n == 16
        return Measurement(steps_measured=3 if slow else 4, steps_wanted=4, stopped_slower=slow,
                           step_s={"median": 2.0 if slow else 1.0 / (1 + n)}, data_wait_fraction=0.5, cost_s=1.0)
    result = search({"num_workers": 0}, [Stage("num_workers", (0, 16), bound_by="data_wait", ordered=True)],
                    measure, budget_s=100, margin=0.05)
    assert seen[0] == (0, None)                                   # the base: nothing to compare against
    assert seen[1] == (16, pytest.approx(1.0 * (1 + SLOWER_STOP * 0.05)))
    row = result.trials[1]
    assert row.status == OK and "stopped after 3 of 4" in row.reason and not row.chosen
    assert result.chosen == {"num_workers": 0} and not result.stopped_by_budget


def test_the_stop_when_slower_callback_fires_only_past_its_limit():
    from types import SimpleNamespace

    from drivebench.bench.autotune import _StopWhenSlower
    from drivebench.perf.callback import PhaseTimes, StepRecord

    def records(*steps):
        times = PhaseTimes("autotune")
        times.records = [StepRecord(step=i, warmup=False, samples=1, step_s=s, data_wait_s=0, h2d_s=0,
                                    gpu_preprocess_s=0, compute_s=s) for i, s in enumerate(steps)]
        return SimpleNamespace(times=times)
    for steps, limit, fires in (((1.0, 1.0), 0.5, False), ((1.0, 1.0, 1.0), 0.5, True), ((0.4, 0.6, 0.4), 0.5, False),
                                ((1.0, 1.0, 1.0), None, False)):
        trainer = SimpleNamespace(should_stop=False)
        callback = _StopWhenSlower(records(*steps), limit)
        callback.on_train_batch_end(trainer)
        assert trainer.should_stop is fires and callback.fired is fires, (steps, limit)


def test_compile_is_left_to_the_run_even_when_the_budget_ran_out():
    caps = Capabilities(**{**GPU_CAPS.__dict__, "compile_units": 3})
    stages, not_allowed = plan_stages(caps, auto_numerics=False)
    assert stages[-1].knob == "compile" and stages[-1].in_run and "compile" not in {n["stage"] for n in not_allowed}
    clock = FakeClock()
    calls = []

    def measure(setting, seconds_left, stop_above_s=None):
        calls.append(setting)
        clock.now += 30.0
        return Measurement(steps_measured=4, steps_wanted=4, step_s={"median": 1.0}, data_wait_fraction=0.5, cost_s=30)
    base = {knob: None for knob in ("num_workers", "prefetch_factor", "cuda_graphs", "compile", "pin_memory",
                                    "fused_optimizer")}
    base.update(num_workers=8, compile=False, cuda_graphs="off")
    result = search(base, stages, measure, budget_s=50, margin=0.05, clock=clock)
    assert result.stopped_by_budget and all(not setting["compile"] for setting in calls)  # never timed here
    row = next(t for t in result.trials if t.stage == "compile")
    assert row.status == IN_RUN and row.setting["compile"] is True and result.in_run == ["compile"]
    assert not any(t.stage == "compile" and t.status == SKIPPED for t in result.trials)


class _TinyModule:
    """A LightningModule around one compiled Linear (dynamo's eager backend: a real compiled call, no codegen)."""

    @staticmethod
    def build():
        import lightning.pytorch as pl
        import torch
        from torch import nn

        class Tiny(pl.LightningModule):
            def __init__(self):
                super().__init__()
                self.net = nn.Linear(4, 1)
                self.graphed_loss = None

            def training_step(self, batch, batch_idx):
                return self.net(batch[0]).pow(2).mean()

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.01)

        module = Tiny()
        module.net.compile(backend="eager")
        data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(64, 4)), batch_size=4)
        return module, data


@pytest.mark.parametrize("compiled_s, eager_s, kept", [
    (0.3825, 0.3962, True),   # GaussianFormer, H100 (b41): 3.5% faster, inside the margin; undone until 2026-12-05
    (0.400, 0.396, True),     # 1% slower: inside the noise, max's value stays
    (0.636, 0.591, False),    # SparseDrive, H100 (b40): eager 7.6% faster
])
def test_compile_goes_only_when_eager_is_faster_by_more_than_the_margin(compiled_s, eager_s, kept):
    from drivebench.accel.compile_judge import keeps_compile

    assert keeps_compile(compiled_s, eager_s, margin=0.05) is kept


@pytest.mark.parametrize("eager_step_s, kept", [(60.0, True), (1e-9, False)])
def test_the_run_keeps_compile_unless_the_eager_choice_beats_its_own_steps(tmp_path, eager_step_s, kept):
    import lightning.pytorch as pl

    from drivebench.accel.compile_judge import CompileJudge
    from drivebench.perf.callback import StepTimer

    module, data = _TinyModule.build()
    eager = {"num_workers": 0, "compile": False, "cuda_graphs": "off"}
    block = {"base": dict(eager), "eager_choice": dict(eager), "chosen": {**eager, "compile": True},
             "changed": {"compile": True}, "trials": [{"stage": "base", "chosen": True},
                                                      {"stage": "compile", "status": IN_RUN, "chosen": False}]}
    timer = StepTimer("train", warmup_steps=1)
    judge = CompileJudge(timer, {"net": module.net}, eager_step_s, margin=0.05, steps=3, graphs_after_revert=False,
                         record=block)
    trainer = pl.Trainer(max_steps=8, logger=False, callbacks=[timer, judge], enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
                         default_root_dir=str(tmp_path))
    trainer.fit(module, data)
    verdict = block["compile_in_run"]
    assert verdict["judged"] and verdict["kept"] is kept and verdict["judged_at_step"] == 4  # 1 warm-up + 3 measured
    assert (module.net._compiled_call_impl is not None) is kept
    row = block["trials"][1]
    assert row["chosen"] is kept and row["steps_measured"] == 3 and row["step_s_median"] == verdict["compiled_step_s"]
    assert block["chosen"]["compile"] is kept and ("compile" in block["changed"]) is kept
    assert trainer.global_step == 8  # the run goes on either way


def test_a_candidate_shares_an_image_cache_only_when_it_holds_the_same_files(drivebench_cache, tmp_path):
    from drivebench.accel.shm_cache import SharedArrayCache

    first = build_run(_cfg(drivebench_cache, tmp_path, "accel.num_workers=0"), tmp_path / "a", progress=False)
    first.datamodule.prepare_data()
    first.datamodule.setup("fit")
    cache = first.datamodule.transform.image_cache
    assert isinstance(cache, SharedArrayCache) and len(cache.keys) > 0
    second = build_run(_cfg(drivebench_cache, tmp_path, "accel.num_workers=0"), tmp_path / "b", progress=False)
    second.datamodule.transform.share_image_cache(cache)
    second.datamodule.setup("fit")
    assert second.datamodule.transform.image_cache is cache
    other = SharedArrayCache(list(cache.keys[:1]), lambda key: cache.get(key), max_bytes=2**30, progress=False)
    third = build_run(_cfg(drivebench_cache, tmp_path, "accel.num_workers=0"), tmp_path / "c", progress=False)
    third.datamodule.transform.share_image_cache(other)   # one file of the split: not this split's cache
    third.datamodule.setup("fit")
    own = third.datamodule.transform.image_cache
    assert own is not other and own is not cache and own.keys == cache.keys


def test_live_knobs_are_timed_on_the_run_and_a_waiting_loader_restarts_it_after_loader_trials(drivebench_cache, tmp_path,
                                                                                              capsys):
    """``accel.auto_in_run=true`` on the CPU: nothing but the loader's stages needs a short fit, so the run starts at
    once; its first segment waits for the slow loader, so it stops, the loader's stages get their short fits, and the
    run starts again from step 0, timing precision (the CPU's live knob) on its own steps."""
    from drivebench.app import main

    cfg = _cfg(drivebench_cache, tmp_path, "accel.num_workers=0", "accel.auto_in_run=true", "accel.auto_numerics=true",
               "bench.steps=14", "bench.warmup_steps=1", "bench.ceiling=false", "bench.val_batches=0",
               "accel.auto_budget_s=30", sleep_s=0.15)
    summary = main(cfg)
    out = capsys.readouterr().out
    block = summary["autotune"]
    assert "the run starts again after them" in out and "on the run's own steps: 2 segments" in out
    assert block["retuned"]["steps"] == 6 and "waiting for data" in block["retuned"]["reason"]
    short = [r for r in block["trials"] if r["where"] == "trial"]
    in_run = [r for r in block["trials"] if r["where"] == "run"]
    assert short[0]["change"] == "base" and short[0]["setting"]["num_workers"] == 0
    assert block["chosen"]["num_workers"] >= 1, render_trials(block)
    assert [r["stage"] for r in in_run] == ["base", "precision"], render_trials(block)
    assert in_run[0]["setting"]["num_workers"] == block["chosen"]["num_workers"]
    # the run after the restart trained its whole schedule from step 0; its statistics exclude the trial's steps
    assert summary["train"]["steps_total"] == 15
    segments = block["in_run_trial"]["steps"]  # 2 warm-up + 4 measured each, 2 + 3 for one stopped as far slower
    assert segments in (11, 12) and summary["train"]["steps_measured"] == 15 - segments - 1
    # the cost: the lost attempt, the short fits, and what the segments took beyond the choice
    assert block["cost_s"] == pytest.approx(block["retuned"]["lost_s"] + sum(r["cost_s"] for r in short)
                                            + block["in_run_trial"]["excess_s"], abs=1.0)
    assert summary["settings"]["accel"]["precision"] == block["chosen"]["precision"]
    events = list((tmp_path / "run").rglob("events.out.tfevents.*"))
    assert len(events) == 1  # the stopped attempt's TensorBoard file is gone: the run logs from step 0 once


def test_the_trial_table_says_why_checkpointing_kept_its_short_fits_and_the_segments_peak():
    block = {"preset": "auto", "trials": [], "changed": {}, "cost_s": 12.0, "budget_s": 60, "stopped_by_budget": False,
             "margin": 0.05, "not_allowed": [],
             "in_run_trial": {"segments": 5, "steps": 72, "wall_s": 40.0, "excess_s": 11.1, "peak_device_gb": 54.0},
             "capabilities": {"checkpointed": True,
                              "checkpointing_live": "70.00 GiB of activations at batch 6 exceed 25% of device memory"}}
    text = render_trials(block)
    assert ("activation_checkpointing in short fits, not on the run's steps: 70.00 GiB of activations at batch 6 "
            "exceed 25% of device memory") in text
    assert "+11.1 s beyond the same steps at the choice (the cost of those rows); their peak 54.0 GiB" in text
    block["capabilities"]["checkpointing_live"] = ""  # timed on the run's steps: nothing to explain
    assert "in short fits" not in render_trials(block)
