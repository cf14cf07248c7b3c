"""Activation checkpointing of the ResNet backbones: same losses and gradients, less kept for backward."""

from __future__ import annotations

import random

import pytest
import torch

from drivebench.models import create_model, get_spec
from drivebench.models.common.backbone import ResNetBackbone
from drivebench.models.common.checkpointing import (
    checkpointable_backbones, saved_activation_bytes, set_activation_checkpointing,
)
from test_gaussianformer_model import make_batch
from test_sparsedrive_factory import make_sequence, one_torch_thread  # noqa: F401 (autouse fixture)


def _saved_bytes(fn, module: torch.nn.Module) -> tuple[int, object]:
    """Bytes of distinct activation storages autograd keeps for backward while ``fn`` runs (weights left out:
    they stay alive either way)."""
    weights = {t.untyped_storage().data_ptr() for t in (*module.parameters(), *module.buffers())}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return sum(n for ptr, n in seen.items() if ptr not in weights), out


@pytest.mark.parametrize("frozen_stages, norm_eval", [(-1, False), (1, True)])  # SparseDrive's, GaussianFormer's
def test_backbone_same_numbers_less_memory_and_the_estimate_is_the_difference(frozen_stages, norm_eval):
    torch.manual_seed(0)
    backbone = ResNetBackbone("resnet50", out_indices=(0, 1, 2, 3), frozen_stages=frozen_stages,
                              norm_eval=norm_eval, width_div=16).train()
    x = torch.randn(2, 3, 64, 96)
    results = {}
    for enabled in (False, True):
        backbone.activation_checkpointing = enabled
        stats_before = {k: v.clone() for k, v in backbone.state_dict().items()}
        saved, outs = _saved_bytes(lambda: backbone(x), backbone)
        grads = torch.autograd.grad(sum((o * (i + 1)).sum() for i, o in enumerate(outs)),
                                    [p for p in backbone.parameters() if p.requires_grad])
        stats_after = {k: v.clone() for k, v in backbone.state_dict().items()}
        backbone.load_state_dict(stats_before)  # both runs start from the same running statistics
        results[enabled] = (saved, outs, grads, stats_after)
    off, on = results[False], results[True]
    for a, b in zip(off[1], on[1]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    for a, b in zip(off[2], on[2]):
        torch.testing.assert_close(a, b)
    for key in off[3]:  # BatchNorm statistics updated once per step, as without checkpointing
        torch.testing.assert_close(off[3][key], on[3][key], rtol=0, atol=0, msg=key)
    if not norm_eval:
        assert not torch.equal(off[3]["stages.0.0.bn1.running_mean"], backbone.state_dict()["stages.0.0.bn1.running_mean"])
    estimate = saved_activation_bytes(backbone, tuple(x.shape))
    # without checkpointing the last block also saves its output (its ReLU's result); with it, nothing in
    # the backbone saves that output, but the neck will: it stays alive either way, as the estimate has it
    last_output = on[1][-1].untyped_storage().nbytes()
    assert estimate > 0 and off[0] - on[0] - last_output == estimate


def test_switch_reaches_the_backbones_of_the_camera_models():
    for name, upstream in (("sparsedrive", True), ("gaussianformer", True), ("maptr", False)):
        net = create_model(name, "test")
        backbones = checkpointable_backbones(net)
        assert len(backbones) == 1 and backbones[0].activation_checkpointing is upstream, name
        assert set_activation_checkpointing(net, not upstream) == 1
        assert backbones[0].activation_checkpointing is (not upstream)
    qcnet_sizes = get_spec("qcnet").sizes  # its CPU size is being renamed from tiny to test
    assert checkpointable_backbones(create_model("qcnet", "test" if "test" in qcnet_sizes else "tiny")) == []


def _loss_and_grads(net, run, seed: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    torch.manual_seed(seed)  # dropout and attention drop draw the same numbers in both runs,
    random.seed(seed)  # and so does the grid mask (Python's RNG)
    loss = run(net)
    params = [p for p in net.parameters() if p.requires_grad]
    return loss.detach(), torch.autograd.grad(loss, params, allow_unused=True)


@pytest.mark.parametrize("model", ["sparsedrive", "gaussianformer"])
def test_losses_and_gradients_equal_with_checkpointing_on_and_off(model):
    torch.manual_seed(0)
    net = create_model(model, "test").train()
    if model == "sparsedrive":
        frames = make_sequence(1, batch_size=2)

        def run(n):
            n.reset_state()
            return n.criterion(frames[0], n(frames[0]))["loss"]
    else:
        from drivebench.models.gaussianformer.losses import OccupancyLoss

        batch, crit = make_batch(2, seed=1), OccupancyLoss()

        def run(n):
            return crit(n(batch)["occ_logits"], batch["occ_label"], batch["occ_mask"])["loss"]
    state = {k: v.clone() for k, v in net.state_dict().items()}
    set_activation_checkpointing(net, False)
    loss_off, grads_off = _loss_and_grads(net, run, seed=5)
    net.load_state_dict(state)
    set_activation_checkpointing(net, True)
    loss_on, grads_on = _loss_and_grads(net, run, seed=5)
    torch.testing.assert_close(loss_on, loss_off, rtol=0, atol=0)
    compared = 0
    for a, b in zip(grads_off, grads_on):
        if a is None:
            assert b is None
            continue
        torch.testing.assert_close(b, a)
        compared += 1
    assert compared > 50


def test_checkpointed_backbone_compiles_whole_and_keeps_the_numbers():
    """Under torch.compile (aot_eager: Dynamo + AOTAutograd without Inductor's codegen) the checkpoints
    trace into the graph without breaks; outputs, gradients and BatchNorm statistics are eager's."""
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    eager = ResNetBackbone("resnet18", out_indices=(1, 3), frozen_stages=-1, norm_eval=False, width_div=8).train()
    compiled = ResNetBackbone("resnet18", out_indices=(1, 3), frozen_stages=-1, norm_eval=False, width_div=8).train()
    compiled.load_state_dict(eager.state_dict())
    compiled.activation_checkpointing = True
    x = torch.randn(2, 3, 32, 48)
    torch._dynamo.reset()
    counters.clear()
    run = torch.compile(compiled, backend="aot_eager")
    results = []
    for module in (eager, run):
        outs = module(x)
        grads = torch.autograd.grad(sum(o.square().mean() for o in outs), list(eager.parameters()) if module is eager
                                    else list(compiled.parameters()))
        results.append((outs, grads))
    assert sum(counters["graph_break"].values()) == 0
    for a, b in zip(results[0][0], results[1][0]):
        torch.testing.assert_close(b, a)
    for a, b in zip(results[0][1], results[1][1]):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)
    for (name, a), b in zip(eager.state_dict().items(), compiled.state_dict().values()):
        torch.testing.assert_close(b, a, msg=name)
