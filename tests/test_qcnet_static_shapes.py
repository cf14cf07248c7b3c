"""accel.cuda_graphs for QCNet: batches padded to shape buckets give the same loss and gradients;
buckets stay few; the knob is settled (or refused) before any work."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from drivebench.accel.cuda_graphs import GraphedLoss, settle_cuda_graphs
from drivebench.models import create_model
from drivebench.models.qcnet import QCNetLoss, make_transform
from drivebench.models.qcnet.random_scenario import random_batch
from drivebench.models.qcnet.static_shapes import ShapeBuckets, StaticShapePadder, batch_counts, pad_batch

SMALL_SCENE = dict(num_agents=6, num_polygons=16, extent=60.0)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def batch():
    return random_batch(make_transform("test"), num_scenes=3, **SMALL_SCENE)


def _loss_and_grads(net, criterion, batch):
    net.zero_grad(set_to_none=True)
    outputs = net(batch)
    losses = criterion(outputs, batch)
    losses["loss"].backward()
    grads = {n: p.grad.detach().clone() for n, p in net.named_parameters() if p.grad is not None}
    # detached: a live autograd graph would keep AccumulateGrad nodes of the default stream alive,
    # which breaks a later CUDA graph capture (as any caller's leftover graph would)
    return {k: v.detach() for k, v in losses.items()}, {k: v.detach() for k, v in outputs.items()}, grads


def test_padded_batch_gives_the_same_loss_gradients_and_real_outputs(batch):
    torch.manual_seed(0)
    net = create_model("qcnet", "test", dropout=0.0)  # dropout would draw other masks over padded tensors
    criterion = QCNetLoss()
    counts = batch_counts(batch)
    capacity = ShapeBuckets(growth=1.5).choose(counts)
    assert all(capacity[k] > counts[k] for k in ("agent", "polygon", "point"))
    assert any(capacity[k] > counts[k] for k in counts if k.startswith("edge_"))
    padded = pad_batch(batch, capacity, net.graph_settings.num_historical_steps, net.graph_settings.num_modes)
    assert batch_counts(padded) == capacity

    ref_losses, ref_out, ref_grads = _loss_and_grads(net, criterion, batch)
    pad_losses, pad_out, pad_grads = _loss_and_grads(net, criterion, padded)

    for name, value in ref_losses.items():
        torch.testing.assert_close(pad_losses[name], value, rtol=1e-5, atol=1e-5, msg=name)
    agents = counts["agent"]
    for name, value in ref_out.items():
        torch.testing.assert_close(pad_out[name][:agents], value, rtol=1e-5, atol=1e-5, msg=name)
    assert ref_grads.keys() == pad_grads.keys()
    for name, grad in ref_grads.items():
        torch.testing.assert_close(pad_grads[name], grad, rtol=1e-5, atol=1e-5, msg=name)


def test_padding_really_reaches_the_sinks_only(batch):
    """Padded edges join padded nodes: no real node gains an edge."""
    capacity = ShapeBuckets(growth=2.0).choose(batch_counts(batch))
    padded = pad_batch(batch, capacity, 50, 6)
    counts = batch_counts(batch)
    real_edges = batch["edge_pl2a"].shape[1]
    extra = padded["edge_pl2a"][:, real_edges:]
    assert extra.shape[1] > 0
    assert (extra[0] >= counts["polygon"]).all() and (extra[1] >= counts["agent"] * 50).all()
    assert not padded["agent_valid_mask"][counts["agent"]:].any()
    assert not padded["agent_predict_mask"][counts["agent"]:].any()
    assert padded["num_graphs"] == batch["num_graphs"]


def test_buckets_stay_few_and_every_batch_fits():
    rng = np.random.default_rng(0)
    base = {"agent": 200, "polygon": 650, "point": 6800, "edge_pl2a": 270_000, "edge_a2a": 99_000}
    buckets = ShapeBuckets(growth=1.15, max_buckets=6)
    for _ in range(750):
        scale = rng.normal(1.0, 0.12)
        counts = {k: max(int(v * scale * rng.normal(1.0, 0.08)), 1) for k, v in base.items()}
        bucket = buckets.choose(counts)
        assert all(bucket[k] >= v for k, v in ShapeBuckets.needed(counts).items())
    assert len(buckets.buckets) <= 7  # at most one beyond max_buckets: the bucket that covers them all


def test_a_batch_that_fits_takes_the_smallest_bucket_in_use():
    buckets = ShapeBuckets(growth=1.0, multiple=1)
    small = buckets.choose({"agent": 9, "edge_t": 10})
    large = buckets.choose({"agent": 99, "edge_t": 100})
    assert small != large
    assert buckets.choose({"agent": 5, "edge_t": 7}) == small
    assert buckets.choose({"agent": 50, "edge_t": 50}) == large
    assert len(buckets.buckets) == 2


def test_padder_reports_its_overhead(batch):
    padder = StaticShapePadder(50, 6, ShapeBuckets(growth=1.5))
    padder(batch)
    report = padder.describe()
    assert report["buckets"] == 1 and report["padded_over_real_rows"] > 1.0


def test_auto_turns_graphs_off_with_the_reason_and_on_refuses():
    assert settle_cuda_graphs("auto", True, 1, 1) == (True, "on")
    enabled, why = settle_cuda_graphs("auto", False, 2, 1)
    assert not enabled and "static shapes" in why and "2 processes" in why
    assert settle_cuda_graphs("off", True, 1, 1) == (False, "off")
    with pytest.raises(ValueError, match="accumulate_grad_batches=2"):
        settle_cuda_graphs("on", True, 1, 2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_graphed_loss_replays_the_eager_loss_and_gradients(monkeypatch):
    # cuDNN's GRU runs in TF32 by default and picks its kernel by shape: the padded (graphed) and the
    # unpadded (eager) batch would then round differently at ~1e-3
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    torch.manual_seed(0)
    device = torch.device("cuda")
    net = create_model("qcnet", "test", dropout=0.0).to(device)
    criterion = QCNetLoss()
    padder = StaticShapePadder(50, 6, ShapeBuckets(growth=1.5))
    graphed = GraphedLoss(net, lambda b: criterion(net(b), b))
    for seed in range(3):
        host = random_batch(make_transform("test"), num_scenes=3, seed=seed, **SMALL_SCENE)
        batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in host.items()}
        ref_losses, _, ref_grads = _loss_and_grads(net, criterion, batch)
        net.zero_grad(set_to_none=True)
        losses = graphed(padder(batch))
        losses["loss"].backward()
        torch.testing.assert_close(losses["loss"], ref_losses["loss"], rtol=1e-4, atol=1e-4)
        for name, param in net.named_parameters():
            worst = ((param.grad - ref_grads[name]).abs().max() / ref_grads[name].abs().max().clamp_min(1e-12)).item()
            torch.testing.assert_close(param.grad, ref_grads[name], rtol=1e-3, atol=1e-4,
                                       msg=f"{name} (batch {seed}): max |diff| / max |grad| = {worst:.2e}")
    assert graphed.describe()["graphs"] == len(padder.buckets.buckets)


def test_release_drops_the_graphs_and_keeps_the_counts():
    graphed = GraphedLoss(torch.nn.Linear(1, 1), lambda b: {"loss": b["x"].sum()})
    graphed._graphs[("shape",)] = torch.nn.Identity()  # stands for a capture (CPU: nothing to capture)
    graphed.capture_s.append(1.5)
    graphed.release()
    assert graphed._graphs == {}
    assert graphed.describe()["graphs"] == 1 and graphed.describe()["capture_s"] == [1.5]


def test_release_frees_a_capture_that_lives_in_a_reference_cycle():
    """make_graphed_callables leaves the module in a cycle (its ``forward`` a closure over the module): release
    must free it at once, not at Python's next full collection (b37: 125 GiB of graph pools held)."""
    import gc
    import weakref

    def stand_in_capture() -> torch.nn.Module:
        module = torch.nn.Linear(1, 1)
        original = module.forward
        module.forward = lambda *args: original(*args) if module.training else None  # the cycle torch makes
        return module

    gc.disable()  # no automatic collection may do release's work here
    try:
        graphed = GraphedLoss(torch.nn.Linear(1, 1), lambda b: {"loss": b["x"].sum()})
        graphed._graphs[("shape",)] = capture = stand_in_capture()
        alive = weakref.ref(capture)
        del capture
        graphed.release()
        assert alive() is None
    finally:
        gc.enable()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_graphs_share_one_pool_and_released_ones_give_their_memory_back():
    """The shapes' graphs share one memory pool (a pool each held the sum of their activations: 56-67 GiB for
    QCNet, b36), and an accel=auto trial releases and recaptures them at each switch: the released ones' memory
    must go at once (b37: an auto run ran out of memory with 125 GiB in graph pools). cuBLAS keeps a workspace
    per stream, each capture's included: cleared before each reading, as Lightning does at a fit's end."""
    def settled_bytes() -> tuple[int, int]:
        torch.cuda.synchronize()
        if hasattr(torch._C, "_cuda_clearCublasWorkspaces"):
            torch._C._cuda_clearCublasWorkspaces()
        return torch.cuda.memory_allocated(), torch.cuda.memory_reserved()

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(256, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1)).cuda()
    graphed = GraphedLoss(net, lambda b: {"loss": net(b["x"]).square().mean()})
    torch.cuda.empty_cache()
    allocated_before, reserved_before = settled_bytes()
    growth = []
    for rows in (8192, 8064, 7936):  # each fits in the first one's freed intermediates
        graphed({"x": torch.randn(rows, 256, device="cuda")})["loss"].backward()
        net.zero_grad(set_to_none=True)
        growth.append(settled_bytes()[1] - reserved_before)
    assert growth[0] > 64 * 2**20  # the activations of one capture: 8192 x 4096 floats each
    assert growth[-1] < 1.5 * growth[0], f"reserved after 1, 2, 3 captures: {growth}"
    held = settled_bytes()[0] - allocated_before
    graphed.release()
    assert settled_bytes()[0] - allocated_before < 0.1 * held + 2**20


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_graphs_survive_a_second_fit(tmp_path):
    """The bench runs training, then the ceiling, as two Trainer.fit calls; Lightning frees the cuBLAS
    workspaces between them, so each fit must capture its own graphs (an illegal memory access otherwise)."""
    import functools

    import lightning.pytorch as pl

    from drivebench.lit.qcnet import QCNetModule

    torch.manual_seed(0)
    module = QCNetModule(create_model("qcnet", "test", dropout=0.0),
                         optimizer=functools.partial(torch.optim.AdamW, lr=1e-4))
    module.enable_cuda_graphs()
    batches = [random_batch(make_transform("test"), num_scenes=2, seed=s, **SMALL_SCENE) for s in range(3)]
    for _ in range(2):
        trainer = pl.Trainer(accelerator="gpu", devices=1, max_steps=3, logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(tmp_path))
        trainer.fit(module, train_dataloaders=torch.utils.data.DataLoader(batches, batch_size=None))
        torch.cuda.synchronize()
    report = module.cuda_graphs_report()
    assert report["replays"] == 6 and report["graphs"] >= 2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_dropout_draws_a_new_mask_at_every_replay(compiled):
    """A replay repeats the captured kernels; dropout's random numbers must still be new at every step (the
    generator's offset advances per replay), or every step of one padded shape would drop the same units
    (QCNet's `max` runs its compiled layers inside the captured step)."""
    torch.manual_seed(0)
    layer = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Dropout(0.5)).cuda()
    body = torch.compile(layer) if compiled else layer
    graphed = GraphedLoss(layer, lambda b: {"loss": body(b["x"]).square().sum()})
    x = torch.randn(32, 64, device="cuda")
    losses, grads = [], []
    for _ in range(4):
        layer.zero_grad(set_to_none=True)
        out = graphed({"x": x})
        out["loss"].backward()
        losses.append(out["loss"].item())
        grads.append(layer[0].weight.grad.detach().clone())
    assert graphed.describe()["graphs"] == 1 and graphed.replays == 4
    assert len(set(losses)) == 4, f"the same loss replayed: {losses}"
    assert all(not torch.equal(a, b) for a, b in zip(grads, grads[1:]))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_graphed_training_steps_follow_the_eager_ones_through_the_optimizer(tmp_path, monkeypatch):
    """Several optimizer steps in a real fit, graphed and eager, from the same weights on the same batches:
    the captured backward writes each step's gradients into the same buffers, which the optimizer then reads
    and Lightning zeroes; an aliasing slip there (a gradient added twice, a stale one kept) shows as diverging
    weights after a few steps, where one graphed step alone matches."""
    import copy

    import lightning.pytorch as pl

    from drivebench.lit.qcnet import QCNetModule

    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    torch.manual_seed(0)
    net = create_model("qcnet", "test", dropout=0.0)
    batches = [random_batch(make_transform("test"), num_scenes=2, seed=s % 2, **SMALL_SCENE) for s in range(6)]
    weights = {}
    for graphs in (False, True):
        # SGD: a step moves each weight in proportion to its gradient (Adam would hide a doubled one)
        module = QCNetModule(copy.deepcopy(net), optimizer=functools.partial(torch.optim.SGD, lr=0.05, momentum=0.9))
        if graphs:
            module.enable_cuda_graphs()
        trainer = pl.Trainer(accelerator="gpu", devices=1, max_steps=6, logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(tmp_path))
        trainer.fit(module, train_dataloaders=torch.utils.data.DataLoader(batches, batch_size=None))
        weights[graphs] = {n: p.detach().cpu().clone() for n, p in module.net.named_parameters()}
        if graphs:
            assert module.cuda_graphs_report()["replays"] == 6
    start = {n: p.detach().clone() for n, p in net.named_parameters()}
    moved = {n: weights[False][n] - start[n] for n in start}
    assert any(m.abs().max() > 0 for m in moved.values()), "the eager fit changed no weight"
    for name, eager_move in moved.items():
        torch.testing.assert_close(weights[True][name] - start[name], eager_move, rtol=1e-3, atol=1e-5,
                                   msg=f"{name}: its change over 6 steps")


def _refusing_backend(gm, example_inputs):
    raise RuntimeError("compiled")


def test_qcnet_validates_eagerly_while_training_runs_the_compiled_layers(batch):
    """Validation batches are unpadded, so compiled layers would compile again for each: QCNetModule runs
    validation_step under the force_eager stance; training still goes through the compiled units."""
    import torch._dynamo

    from drivebench.lit.qcnet import QCNetModule

    torch._dynamo.reset()
    net = create_model("qcnet", "test", compile_scope="layers")
    module = QCNetModule(net, optimizer=lambda params: torch.optim.AdamW(params))
    assert module.eager_validation
    for unit in net.compile_units().values():
        unit.compile(backend=_refusing_backend)
    module.log = lambda *args, **kwargs: None  # no Trainer here
    # apply_compile turns suppress_errors on process-wide: off here, so a compiled call raises
    with torch._dynamo.config.patch(suppress_errors=False):
        _validate_then_train(module, batch)


def _validate_then_train(module, batch) -> None:
    try:
        module.eval()
        module.validation_step(batch, 0)  # eager: the refusing backend is never asked
        assert module.model_metrics.compute()  # the metrics saw the batch
        module.train()
        with pytest.raises(Exception, match="compiled"):
            module.loss_of_batch(batch)
    finally:
        torch._dynamo.reset()


def test_bucket_knobs_reach_the_padder_and_bad_values_are_refused():
    from drivebench.lit.qcnet import QCNetModule

    net = create_model("qcnet", "test")
    module = QCNetModule(net, optimizer=lambda params: torch.optim.AdamW(params), bucket_growth=1.5, max_buckets=2)
    assert (module.buckets.growth, module.buckets.max_buckets) == (1.5, 2)
    with pytest.raises(ValueError, match="growth must be >= 1"):
        QCNetModule(net, optimizer=lambda params: torch.optim.AdamW(params), bucket_growth=0.9)


def _qcnet_module(trainer: bool = False, **kwargs):
    from drivebench.lit.qcnet import QCNetModule

    torch.manual_seed(0)
    module = QCNetModule(create_model("qcnet", "test", dropout=0.0), optimizer=lambda params: torch.optim.AdamW(params),
                         **kwargs)
    if trainer:
        return module  # a Trainer switches it between train and eval
    module.log = lambda *args, **kwargs: None  # no Trainer here
    return module.eval()


def _validation_metrics(module, batches, pad: bool) -> tuple[dict[str, float], list[dict[str, torch.Tensor]]]:
    module.reset_metrics()
    losses = []
    with torch.no_grad():
        for batch in batches:
            batch = module.static_val_batch(batch) if pad else batch
            flat = module._eval_outputs(batch)
            outputs = {k[len("out/"):]: v for k, v in flat.items() if k.startswith("out/")}
            losses.append({k: v for k, v in flat.items() if k.startswith("loss/")})
            module.update_metrics(batch, outputs)
    return module.compute_metrics(), losses


def test_padded_validation_batches_give_the_same_metrics_and_leave_training_buckets_alone():
    """What the validation graphs run (accel.cuda_graphs): each batch padded to a bucket of validation's own,
    outputs and losses from ``_eval_outputs``; metrics and losses as on the unpadded batches."""
    module = _qcnet_module(bucket_growth=1.3)
    batches = [random_batch(make_transform("test"), num_scenes=2 + s % 2, seed=10 * s, **SMALL_SCENE) for s in range(4)]
    ref_metrics, ref_losses = _validation_metrics(module, batches, pad=False)
    pad_metrics, pad_losses = _validation_metrics(module, batches, pad=True)
    assert ref_metrics.keys() == pad_metrics.keys() and "minFDE" in ref_metrics and "cv_minFDE" in ref_metrics
    for name, value in ref_metrics.items():
        assert pad_metrics[name] == pytest.approx(value, rel=1e-5, abs=1e-5), name
    for ref, pad in zip(ref_losses, pad_losses):
        for name, value in ref.items():
            torch.testing.assert_close(pad[name], value, rtol=1e-5, atol=1e-5, msg=name)
    assert module.val_padder.describe()["padded_over_real_rows"] > 1.0  # the batches really were padded
    assert module.buckets.buckets == [] and module.padder is None  # training's shapes untouched


def _fit_with_validation(tmp_path, module, train_batches, val_batches) -> dict[str, float]:
    import lightning.pytorch as pl

    trainer = pl.Trainer(accelerator="gpu", devices=1, max_epochs=2, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                         default_root_dir=str(tmp_path))
    loader = torch.utils.data.DataLoader
    trainer.fit(module, train_dataloaders=loader(train_batches, batch_size=None),
                val_dataloaders=loader(val_batches, batch_size=None))
    torch.cuda.synchronize()
    return {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_graphed_validation_in_a_fit_gives_the_eager_metrics(tmp_path, monkeypatch):
    """accel.cuda_graphs replays validation's forward + loss inside a fit: the same val metrics as an eager fit
    of the same module state, graphs captured once per validation shape and replayed in the next epoch."""
    import copy

    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    train = [random_batch(make_transform("test"), num_scenes=2, seed=s, **SMALL_SCENE) for s in range(2)]
    val = [random_batch(make_transform("test"), num_scenes=2 + s % 2, seed=100 + s, **SMALL_SCENE) for s in range(3)]
    eager = _qcnet_module(trainer=True)
    eager.optimizer_factory = functools.partial(torch.optim.SGD, lr=0.0)  # no update: both fits see one state
    graphed = copy.deepcopy(eager)
    graphed.enable_cuda_graphs()
    graphed.graphed_loss = None  # training eager in both: only validation differs
    ref = _fit_with_validation(tmp_path, eager, train, val)
    got = _fit_with_validation(tmp_path, graphed, train, val)
    assert "val/minFDE" in ref and ref.keys() == got.keys()
    for name, value in ref.items():
        assert got[name] == pytest.approx(value, rel=1e-4, abs=1e-4), name
    report = graphed.cuda_graphs_report()["validation"]
    assert report["replays"] == 2 * len(val)  # both epochs' validations replayed
    # one capture per padded shape; per-scene tensors (not padded) make a batch of 3 scenes its own shape
    assert report["padding"]["buckets"] <= report["graphs"] == len(report["capture_s"]) <= len(val)


def test_validation_inside_a_fit_goes_through_the_graphed_path_and_a_standalone_one_does_not(tmp_path):
    """The plumbing around the CUDA-only replay, on the CPU: inside a fit, validation_step pads the batch and takes
    outputs and losses from ``graphed_eval`` (here the function it would capture, called directly); a standalone
    ``Trainer.validate`` (whose graphs would point into freed cuBLAS workspaces) runs eagerly."""
    import lightning.pytorch as pl

    module = _qcnet_module(trainer=True)
    module.optimizer_factory = functools.partial(torch.optim.SGD, lr=0.0)
    calls = []

    class Direct:  # what GraphedForward would capture and replay, called as it is
        def __call__(self, batch):
            calls.append(batch_counts(batch))
            return module._eval_outputs(batch)

        def release(self) -> None:
            pass

    module.graphed_eval = Direct()
    train = [random_batch(make_transform("test"), num_scenes=2, seed=s, **SMALL_SCENE) for s in range(2)]
    val = [random_batch(make_transform("test"), num_scenes=2, seed=100 + s, **SMALL_SCENE) for s in range(2)]
    loader = torch.utils.data.DataLoader
    trainer = pl.Trainer(accelerator="cpu", max_epochs=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                         default_root_dir=str(tmp_path))
    trainer.fit(module, train_dataloaders=loader(train, batch_size=None), val_dataloaders=loader(val, batch_size=None))
    fit_metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
    assert len(calls) == len(val)
    assert all(counts in [dict(b) for b in module.val_padder.buckets.buckets] for counts in calls)  # padded
    standalone = trainer.validate(module, dataloaders=loader(val, batch_size=None), verbose=False)[0]
    assert len(calls) == len(val)  # not called again
    assert "val/minFDE" in fit_metrics
    for name, value in standalone.items():
        assert fit_metrics[name] == pytest.approx(value, rel=1e-5, abs=1e-5), name
