"""accel=auto's live stages on the run's own steps: segments that train the run, switch knobs between
two steps, keep the run's statistics to the chosen setting, then hand compile to the judge; a run whose
first steps wait for the loader stops and starts again after trials of the loader's knobs.

Real fits on the CPU: a small LightningModule with one compiled unit (dynamo's eager backend) and
precision, the live knob a CPU has (bf16 autocast), switched through Lightning's precision plugin.
"""

from __future__ import annotations

import time
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from torch import nn

from drivebench.accel.autotune import FAILED, IN_RUN, OK, SKIPPED, Stage, Trial
from drivebench.accel.in_run_trial import ALL_WARMUP, InRunTrial, RetuneBeforeRun, close_trial_memory, switch
from drivebench.perf.callback import StepTimer

STAGES = [Stage("precision", ("32-true", "bf16-mixed"), live=True), Stage("compile", (False, True), in_run=True)]
BUILT = {"precision": "32-true", "cuda_graphs": "off"}


class Tiny(pl.LightningModule):
    """One compiled Linear; records whether each training step ran under autocast."""

    def __init__(self, compute_s: float = 0.0, autocast_factor: float = 1.0) -> None:
        super().__init__()
        self.compute_s = compute_s  # a step's own work (a sleep): what the loader has to keep up with
        self.autocast_factor = autocast_factor  # that work under bf16 autocast, as a multiple
        self.net = nn.Sequential(nn.Linear(8, 8))
        self.net[0].compile(backend="eager")
        self.graphed_loss = None
        self.autocast: list[bool] = []

    def training_step(self, batch, batch_idx):
        self.autocast.append(torch.is_autocast_enabled("cpu"))
        time.sleep(self.compute_s * (self.autocast_factor if self.autocast[-1] else 1.0))
        return self.net(batch[0]).float().pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class SlowRows(torch.utils.data.Dataset):
    def __init__(self, sleep_s: float) -> None:
        self.sleep_s = sleep_s

    def __len__(self) -> int:
        return 256

    def __getitem__(self, i: int):
        time.sleep(self.sleep_s)
        return (torch.randn(8),)


def _fit(tmp_path: Path, max_steps: int, sleep_s: float = 0.0, gated: dict | None = None, stages=STAGES,
         compute_s: float = 0.0, margin: float = 0.05, budget_s: float = 60.0, autocast_factor: float = 1.0,
         module: Tiny | None = None, built: dict = BUILT):
    module = module if module is not None else Tiny(compute_s, autocast_factor)
    units = {"net.0": module.net[0]}
    timer = StepTimer("train", warmup_steps=2)
    short_fit = Trial(stage="base", change="base", setting=dict(built), step_s_median=0.01, cost_s=1.5, chosen=True)
    block = {"preset": "auto", "base": dict(built), "margin": margin, "budget_s": 60.0, "cost_s": 1.5,
             "stopped_by_budget": False, "not_allowed": [], "changed": {}, "trials": [short_fit.to_dict()]}
    chosen_live: list[dict] = []
    trial = InRunTrial(timer, stages, dict(built), dict(built), block, margin=margin, steps=4, warmup=1,
                       budget_s=budget_s, units=units, compile_setting={"compile": True}, gated=gated,
                       on_chosen=chosen_live.append)
    data = torch.utils.data.DataLoader(SlowRows(sleep_s), batch_size=4)
    trainer = pl.Trainer(max_steps=max_steps, logger=False, callbacks=[timer, trial], enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
                         default_root_dir=str(tmp_path))
    trainer.fit(module, data)
    return module, timer, trial, block, chosen_live


def test_live_stages_run_as_segments_of_the_run_then_compile_is_judged(tmp_path):
    # a segment is cut short once its median is (1 + 5 x margin) x the incumbent's, and the CPU's bf16 steps of
    # this tiny net took 1.3x-8x the fp32 ones (more on a loaded machine): a step's own work (a 20-ms sleep) and
    # a wide margin keep both segments whole
    module, timer, trial, block, chosen_live = _fit(tmp_path, max_steps=24, compute_s=0.02, margin=1.0)
    rows = [r for r in block["trials"] if r["where"] == "run"]
    assert block["trials"][0]["where"] == "trial" and block["trials"][0]["cost_s"] == 1.5  # the short fits' rows stay
    assert [r["stage"] for r in rows] == ["base", "precision", "compile"]
    assert all(r["status"] == OK and r["steps_measured"] == 4 for r in rows[:2])
    # the second segment (steps 5-9) really ran under bf16 autocast, the first (0-4) did not
    assert module.autocast[:5] == [False] * 5 and module.autocast[5:10] == [True] * 5
    chosen = block["eager_choice"]["precision"]
    assert len(chosen_live) == 1 and chosen_live[0]["precision"] == chosen
    assert module.autocast[10:] == [chosen == "bf16-mixed"] * (24 - 10)   # the run goes on with the choice
    assert block["in_run_trial"]["segments"] == 2 and block["in_run_trial"]["steps"] == 10
    # the run's statistics hold none of the trial's steps: its warm-up starts after them
    assert timer.warmup_steps == 10 + 2 and all(r.step >= 12 for r in timer.times.measured())
    assert all(r.warmup for r in timer.times.records[:12])
    # compile: set aside during the segments, back afterwards, judged on the next measured steps
    verdict = block["compile_in_run"]
    assert verdict["judged"] and verdict["judged_at_step"] == 10 + 2 + 4
    assert (module.net[0]._compiled_call_impl is not None) is verdict["kept"]
    assert rows[2]["status"] == IN_RUN and rows[2]["setting"]["compile"] is True
    # the trial's cost: what the segments took beyond the same steps at the chosen median, on top of the
    # short fits' cost (1.5 s here); the run's first step (its own set-up) is left out
    excess = sum(r["cost_s"] for r in rows[:2])
    assert block["in_run_trial"]["excess_s"] == pytest.approx(excess)
    assert block["cost_s"] == pytest.approx(1.5 + excess)
    assert block["chosen"].get("compile", False) is verdict["kept"]


def test_a_run_shorter_than_its_trial_keeps_what_it_chose_and_judges_no_compile(tmp_path):
    module, timer, trial, block, _ = _fit(tmp_path, max_steps=7)
    rows = [r for r in block["trials"] if r["where"] == "run"]
    assert rows[0]["status"] == OK and rows[1]["status"] == "cut"
    compile_row = next(r for r in rows if r["stage"] == "compile")
    assert compile_row["status"] == SKIPPED and "training ended" in compile_row["reason"]
    assert block["compile_in_run"]["judged"] is False and block["compile_in_run"]["kept"] is False
    assert module.net[0]._compiled_call_impl is None and "compile" not in block["in_run"]
    assert block["eager_choice"]["precision"] == "32-true"  # a cut candidate is never chosen


def test_the_budget_counts_what_segments_take_beyond_the_run_steps_not_their_wall_time(tmp_path):
    """Two 5-step segments of 60-ms steps take ~0.6 s of wall time; at the same speed they cost ~nothing, so a
    0.3-s budget lets both complete (b39: charged by wall time, SparseDrive's search stopped before bf16)."""
    _, _, _, block, _ = _fit(tmp_path, max_steps=14, compute_s=0.06, margin=1.0, budget_s=0.3)
    rows = [r for r in block["trials"] if r["where"] == "run"]
    assert [(r["stage"], r["status"], r["steps_measured"]) for r in rows[:2]] == [("base", OK, 4), ("precision", OK, 4)]
    assert block["in_run_trial"]["wall_s"] > 0.5 and not block["in_run_trial"]["stopped_by_budget"]


def test_a_slower_candidate_is_cut_once_its_extra_time_reaches_the_budget(tmp_path):
    """bf16 steps here take 3x the fp32 ones (+120 ms each), under the early stop's 6x: the budget cuts it."""
    module, _, _, block, _ = _fit(tmp_path, max_steps=16, compute_s=0.06, margin=1.0, budget_s=0.2,
                                  autocast_factor=3.0)
    rows = [r for r in block["trials"] if r["where"] == "run"]
    assert rows[1]["stage"] == "precision" and rows[1]["status"] == "cut" and "budget" in rows[1]["reason"]
    assert rows[1]["steps_measured"] < 4 and block["in_run_trial"]["stopped_by_budget"]
    assert block["eager_choice"]["precision"] == "32-true"  # a cut candidate is never chosen
    assert module.autocast[-1] is False  # the run went on at the choice


def test_a_first_segment_waiting_for_the_loader_stops_the_run_for_loader_trials(tmp_path):
    with pytest.raises(RetuneBeforeRun) as stop:
        _fit(tmp_path, max_steps=40, sleep_s=0.01, gated={"num_workers": "data_wait"})
    assert "accel.num_workers" in stop.value.reason and "waiting for data" in stop.value.reason
    assert stop.value.steps == 5 and stop.value.spent_s > 0


def test_a_loader_that_keeps_up_lets_the_run_go_on(tmp_path):
    _, _, trial, block, _ = _fit(tmp_path, max_steps=12, gated={"num_workers": "data_wait"}, compute_s=0.2)
    assert trial.phase in ("judging", "done") and block["in_run_trial"]["segments"] == 2


# max's values on a GPU first, as plan_stages orders them; the run built as accel=auto's base (fp32, NCHW)
GPU_KEY_STAGES = [Stage("precision", ("bf16-mixed", "32-true"), live=True), Stage("tf32", (True, False), live=True),
                  Stage("channels_last", (True, False), live=True), Stage("compile", (False, True), in_run=True)]
KEYS_BUILT = {**BUILT, "tf32": False, "channels_last": False}


class RecordsAutotuning(Tiny):
    """Records, at each training step, whether cuDNN would autotune a new convolution; the first step of each
    autotuning segment takes ``search_s`` longer, as cuDNN's search of its new keys would."""

    def __init__(self, search_s: float = 0.0, **kw) -> None:
        super().__init__(**kw)
        self.search_s = search_s
        self.autotuning: list[bool] = []

    def training_step(self, batch, batch_idx):
        if torch.backends.cudnn.benchmark and len(self.autotuning) % 5 == 0:  # a 5-step segment's first step
            time.sleep(self.search_s)
        self.autotuning.append(torch.backends.cudnn.benchmark)
        return super().training_step(batch, batch_idx)


@pytest.fixture
def cudnn_flags():
    """accel.cudnn_benchmark on (max's value on a GPU), the global flags restored afterwards."""
    saved = torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32, torch.get_float32_matmul_precision()
    torch.backends.cudnn.benchmark = True
    yield
    torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32 = saved[:2]
    torch.set_float32_matmul_precision(saved[2])


def test_only_the_segment_with_the_runs_convolution_keys_autotunes(tmp_path, cudnn_flags):
    """cuDNN autotunes each new convolution key (dtype, TF32, layout) at its first step and keeps that plan (b42:
    ~15 s a key set for GaussianFormer on an H200, 13% of a bounded run over the trial's four sets). The base,
    bf16 and TF32 segments run keys the run will not train with, if channels-last keeps max's value: heuristics;
    the channels-last segment runs the run's keys: autotuned, as max's first step; the run after it autotunes."""
    module = RecordsAutotuning(search_s=0.5, compute_s=0.02)
    _, _, _, block, _ = _fit(tmp_path, max_steps=32, stages=GPU_KEY_STAGES, margin=1.0, module=module, built=KEYS_BUILT)
    rows = [r for r in block["trials"] if r["where"] == "run"]
    assert [r["stage"] for r in rows[:4]] == ["base", "precision", "tf32", "channels_last"]
    # that search is the one a run at the chosen setting (max) pays at its first step: not the trial's cost
    assert rows[3]["warmup_steps_s"][0][0] >= 0.5 and abs(rows[3]["cost_s"]) < 0.25
    assert all(  # max's values, within the wide margin
        block["eager_choice"][k] == v for k, v in {"precision": "bf16-mixed", "tf32": True, "channels_last": True}.items())
    assert module.autotuning[:20] == [False] * 15 + [True] * 5  # four 5-step segments
    assert all(module.autotuning[20:]) and block["cudnn_autotuned"] is True


def test_a_run_whose_keys_first_ran_without_autotuning_says_so(tmp_path, cudnn_flags):
    """The last convolution-key stage keeps a value other than max's (bf16 steps 6x slower here): the keys the run
    trains with first ran in the channels-last segment, which expected bf16 and so did not autotune."""
    from drivebench.bench.autotune import render_trials

    stages = [GPU_KEY_STAGES[1], GPU_KEY_STAGES[2], GPU_KEY_STAGES[0], GPU_KEY_STAGES[3]]  # precision last
    module = RecordsAutotuning(search_s=0.5, compute_s=0.02, autocast_factor=6.0)
    _, _, _, block, _ = _fit(tmp_path, max_steps=24, stages=stages, margin=1.0, module=module, built=KEYS_BUILT)
    assert block["eager_choice"]["precision"] == "32-true"
    assert module.autotuning[:20] == [False] * 15 + [True] * 5  # only the bf16 segment ran the keys max would
    bf16 = [r for r in block["trials"] if r["where"] == "run"][3]
    assert bf16["stage"] == "precision" and bf16["cost_s"] >= bf16["warmup_steps_s"][0][0] - 0.1  # a search the run does not use: charged
    assert block["cudnn_autotuned"] is False and torch.backends.cudnn.benchmark  # the run's flag back on
    assert "the run trains with cuDNN's heuristic plans" in render_trials(block)


def test_which_segments_run_the_runs_convolution_keys():
    from drivebench.accel.in_run_trial import runs_final_conv_keys

    fp32 = {"precision": "32-true", "tf32": False, "channels_last": False}
    assert not runs_final_conv_keys(fp32, "base", GPU_KEY_STAGES)
    assert not runs_final_conv_keys({**fp32, "precision": "bf16-mixed"}, "precision", GPU_KEY_STAGES)
    assert not runs_final_conv_keys({**fp32, "tf32": True}, "tf32", GPU_KEY_STAGES)  # channels-last still to come
    assert runs_final_conv_keys({**fp32, "tf32": True, "channels_last": True}, "channels_last", GPU_KEY_STAGES)
    assert runs_final_conv_keys({**fp32, "channels_last": False}, "channels_last", GPU_KEY_STAGES)  # decided there
    # a start already at max's values (a short fit's choice, a user's bf16) autotunes from its first step
    assert runs_final_conv_keys({"precision": "bf16-mixed", "tf32": True, "channels_last": True}, "base", GPU_KEY_STAGES)
    assert runs_final_conv_keys(fp32, "base", [GPU_KEY_STAGES[3]])  # no convolution-key stage planned


def test_switch_sets_each_live_knob(tmp_path):
    module = Tiny()
    trainer = pl.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False)
    switch("precision", "bf16-mixed", trainer, module)
    assert trainer.precision == "bf16-mixed"
    switch("precision", "32-true", trainer, module)
    assert trainer.precision == "32-true"
    before = torch.get_float32_matmul_precision()
    try:
        switch("tf32", True, trainer, module)
        assert torch.get_float32_matmul_precision() == "high" and torch.backends.cudnn.allow_tf32
        switch("tf32", False, trainer, module)
        assert torch.get_float32_matmul_precision() == "highest" and not torch.backends.cudnn.allow_tf32
    finally:
        torch.set_float32_matmul_precision(before)
    conv = nn.Sequential(nn.Conv2d(3, 4, 3))
    holder = Tiny()
    holder.net = conv
    switch("channels_last", True, trainer, holder)
    assert conv[0].weight.is_contiguous(memory_format=torch.channels_last)
    switch("channels_last", False, trainer, holder)
    assert conv[0].weight.is_contiguous()


class SwitchFusedAt(pl.Callback):
    """Switches ``accel.fused_optimizer`` before the step ``at`` (as a segment boundary does)."""

    def __init__(self, at: int, on: bool) -> None:
        self.at, self.on = at, on

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.at:
            switch("fused_optimizer", self.on, trainer, pl_module)


def _adamw_fit(tmp_path: Path, fused: bool, callbacks=()) -> tuple[Tiny, pl.Trainer]:
    torch.manual_seed(0)
    module = Tiny()
    module.fused_optimizer = fused
    module.configure_optimizers = lambda: torch.optim.AdamW(module.parameters(), lr=1e-2,
                                                            **({"fused": True} if module.fused_optimizer else {}))
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(16, 8)), batch_size=4)
    trainer = pl.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, max_steps=4, default_root_dir=str(tmp_path),
                         callbacks=list(callbacks))
    trainer.fit(module, data)
    return module, trainer


def test_the_fused_optimizer_switches_inside_a_fit(tmp_path, monkeypatch):
    """foreach AdamW for two steps, then the fused kernel for two (and back): the same weights as either kept
    throughout, to rounding; the fused kernel really runs after the switch, with the step counts it needs."""
    import torch.optim.adam as adam_impl

    fused_calls = []
    real = adam_impl._fused_adam
    monkeypatch.setattr(adam_impl, "_fused_adam", lambda *a, **k: (fused_calls.append(1), real(*a, **k))[1])
    plain, _ = _adamw_fit(tmp_path, fused=False)
    assert fused_calls == []
    fused, _ = _adamw_fit(tmp_path, fused=True)
    assert len(fused_calls) == 4
    fused_calls.clear()
    switched, trainer = _adamw_fit(tmp_path, fused=False, callbacks=[SwitchFusedAt(2, True)])
    assert len(fused_calls) == 2 and switched.fused_optimizer  # the last two steps, and a later fit's optimizer
    optimizer = trainer.optimizers[0]
    assert optimizer.param_groups[0]["fused"] is True and optimizer.param_groups[0]["foreach"] is None
    steps = [optimizer.state[p]["step"] for p in switched.parameters()]
    assert all(s.dtype == torch.float32 and float(s) == 4.0 for s in steps)  # counted on across the switch
    for a, b, c in zip(plain.parameters(), fused.parameters(), switched.parameters()):
        torch.testing.assert_close(c, a, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(c, b, rtol=1e-5, atol=1e-6)
    switch("fused_optimizer", False, trainer, switched)
    assert optimizer.param_groups[0]["fused"] is None and not switched.fused_optimizer
    assert all(optimizer.state[p]["step"].device.type == "cpu" for p in switched.parameters())


def test_channels_last_also_moves_the_optimizer_state_to_the_weights_layout(tmp_path):
    """Adam's moments made while the weights were NCHW, then the weights switched to NHWC: the state follows
    (multi-tensor kernels take their fast path only where a parameter and its state share strides)."""
    module = Tiny()
    module.net = nn.Sequential(nn.Conv2d(3, 4, 3))
    module.configure_optimizers = lambda: torch.optim.Adam(module.parameters(), lr=1e-3)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 3, 6, 6)), batch_size=4)
    module.training_step = lambda batch, *rest: module.net(batch[0]).pow(2).mean()
    trainer = pl.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, max_steps=2, default_root_dir=str(tmp_path))
    trainer.fit(module, data)
    weight = module.net[0].weight
    state = trainer.optimizers[0].state[weight]
    assert state["exp_avg"].is_contiguous() and not state["exp_avg"].is_contiguous(memory_format=torch.channels_last)
    switch("channels_last", True, trainer, module)
    state = trainer.optimizers[0].state[weight]
    assert all(state[k].is_contiguous(memory_format=torch.channels_last) for k in ("exp_avg", "exp_avg_sq"))
    assert state["exp_avg"].stride() == weight.stride()
    switch("channels_last", False, trainer, module)
    assert trainer.optimizers[0].state[weight]["exp_avg"].stride() == weight.stride() == weight.contiguous().stride()
    with pytest.raises(ValueError, match="cannot be switched inside a fit"):
        switch("num_workers", 4, trainer, module)


def test_the_timer_counts_every_trial_step_as_warm_up_until_the_search_ends(tmp_path):
    timer = StepTimer("train", warmup_steps=2)
    trial = InRunTrial(timer, STAGES, dict(BUILT), dict(BUILT), {"base": {}}, margin=0.05, steps=4, warmup=1,
                       budget_s=60.0, units={}, compile_setting={})
    module = Tiny()
    trainer = pl.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False)
    trial.on_train_start(trainer, module)
    assert timer.warmup_steps == ALL_WARMUP and trial.phase == "segments"


class RecomputingBlock(nn.Module):
    """A backbone with the switch ``set_activation_checkpointing`` flips (what the ResNets declare); records the
    switch at each forward, as the ResNets read it."""

    supports_activation_checkpointing = True

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)
        self.activation_checkpointing = True  # upstream's with_cp
        self.seen: list[bool] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(self.activation_checkpointing)
        if self.activation_checkpointing:
            return torch.utils.checkpoint.checkpoint(self.linear, x, use_reentrant=False)
        return self.linear(x)


def test_activation_checkpointing_switches_on_the_run_own_steps(tmp_path):
    """The stage live (where dropping the recomputation fits): its segments train the run with checkpointing on,
    then off; the run goes on with the choice, and the summary's knob follows it."""
    block_net = RecomputingBlock()
    stages = [Stage("activation_checkpointing", ("keep", "off"), live=True)]
    built = {"activation_checkpointing": "keep", "cuda_graphs": "off"}

    class Holder(Tiny):
        def __init__(self) -> None:
            super().__init__(compute_s=0.02)
            self.net = nn.Sequential(block_net)

    module = Holder()
    timer = StepTimer("train", warmup_steps=1)
    block = {"preset": "auto", "base": dict(built), "margin": 1.0, "budget_s": 60.0, "cost_s": 0.0, "trials": [],
             "stopped_by_budget": False, "not_allowed": [], "changed": {}}
    chosen: list[dict] = []
    trial = InRunTrial(timer, stages, dict(built), dict(built), block, margin=1.0, steps=3, warmup=1, budget_s=60.0,
                       units={}, compile_setting={}, on_chosen=chosen.append)
    data = torch.utils.data.DataLoader(SlowRows(0.0), batch_size=4)
    trainer = pl.Trainer(max_steps=14, logger=False, callbacks=[timer, trial], enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
                         default_root_dir=str(tmp_path))
    trainer.fit(module, data)
    rows = [r for r in block["trials"] if r["where"] == "run"]
    assert [(r["stage"], r["change"], r["status"]) for r in rows] == [
        ("base", "base", OK), ("activation_checkpointing", "activation_checkpointing=off", OK)]
    assert block_net.seen[:4] == [True] * 4 and block_net.seen[4:8] == [False] * 4  # keep's segment, then off's
    value = block["eager_choice"]["activation_checkpointing"]
    assert chosen == [{"activation_checkpointing": value, "cuda_graphs": "off"}]
    assert block_net.seen[8:] == [value == "keep"] * (14 - 8)
    switch("activation_checkpointing", "keep", trainer, module)
    assert block_net.activation_checkpointing
    with pytest.raises(ValueError, match="activation_checkpointing='auto' cannot be switched inside a fit"):
        switch("activation_checkpointing", "auto", trainer, module)


def test_the_trial_memory_is_closed_off_on_a_cpu_as_nothing():
    assert close_trial_memory(torch.device("cpu")) == {}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA caching allocator's peak")
def test_the_trial_peak_is_recorded_then_the_run_peak_restarts():
    """A dropped candidate's memory (here 1 GiB held and freed during the 'segments') is the trial's peak, not the
    run's: the counters restart and the cached block goes back to the driver."""
    device = torch.device("cuda")
    big = torch.empty(2**28, dtype=torch.float32, device=device)  # 1 GiB
    del big
    peak = close_trial_memory(device)
    assert peak["peak_device_gb"] >= 1.0 and peak["peak_device_reserved_gb"] >= 1.0
    assert torch.cuda.max_memory_allocated(device) < 2**29 and torch.cuda.memory_reserved(device) < 2**30


def test_the_terminal_summary_gives_the_trial_peak_beside_the_run_peak():
    from drivebench.perf.summary import render_table

    summary = {"memory": {"peak_device_gb": 30.0},
               "autotune": {"in_run_trial": {"segments": 5, "peak_device_gb": 54.0}}}
    assert "30 GiB (after the accel trial; its segments: 54 GiB)" in render_table(summary)
    assert "(after the accel trial" not in render_table({"memory": {"peak_device_gb": 30.0}})


class _RaiseInBackward(torch.autograd.Function):
    """Identity forward; its backward fails as an op without a kernel for the dtype would."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError('"deformable_col2im" not implemented for \'BFloat16\'')


class FailsUnderAutocast(Tiny):
    """Tiny, whose step fails under bf16 autocast, in its forward or its backward (GaussianFormer's deformable
    convolution on a CPU: torchvision has no bf16 CPU kernel for it)."""

    def __init__(self, where: str, fail_when_autocast: bool = True) -> None:
        super().__init__()
        self.where, self.fail_when_autocast = where, fail_when_autocast

    def training_step(self, batch, batch_idx):
        autocast = torch.is_autocast_enabled("cpu")
        self.autocast.append(autocast)
        out = self.net(batch[0]).float()
        if autocast == self.fail_when_autocast:
            if self.where == "forward":
                raise RuntimeError('"deformable_im2col" not implemented for \'BFloat16\'')
            out = _RaiseInBackward.apply(out)
        return out.pow(2).mean()


@pytest.mark.parametrize("where", ["forward", "backward"])
def test_a_candidate_whose_step_fails_fails_its_row_and_the_run_goes_on_with_the_incumbent(tmp_path, where):
    module, _, _, block, _ = _fit(tmp_path, max_steps=16, module=FailsUnderAutocast(where))
    rows = [r for r in block["trials"] if r["where"] == "run"]
    precision = next(r for r in rows if r["stage"] == "precision")
    assert precision["status"] == FAILED and "not implemented for 'BFloat16'" in precision["reason"]
    assert precision["reason"].startswith("RuntimeError: ")
    assert not precision["chosen"] and block["eager_choice"]["precision"] == "32-true"
    # the base segment (5 steps), one failed bf16 step, then fp32 again to the end of the run
    assert module.autocast[:5] == [False] * 5 and module.autocast[5] is True
    assert not any(module.autocast[6:]) and len(module.autocast) >= 16
    assert module.trainer.global_step >= 15 and block["in_run_trial"]["segments"] == 2
    # the guard is gone with the segments: the module's own methods again
    assert "training_step" not in vars(module) and "backward" not in vars(module)
    assert all(torch.isfinite(p).all() for p in module.parameters())


def test_the_setting_the_run_starts_from_failing_is_the_runs_own_error(tmp_path):
    """The base segment is no candidate: its failure ends the run, as it would without a trial."""
    with pytest.raises(RuntimeError, match="deformable_im2col"):
        _fit(tmp_path, max_steps=8, module=FailsUnderAutocast("forward", fail_when_autocast=False))
