"""SparseDrive: registry sizes, output shapes, finite losses, gradients, and learning on a tiny sequence."""

from __future__ import annotations

import pytest
import torch

from drivebench.models.registry import create_model, get_spec
from test_sparsedrive_factory import make_sequence, one_torch_thread  # noqa: F401 (autouse fixture)


def _test_model(**overrides) -> torch.nn.Module:
    torch.manual_seed(0)
    return create_model("sparsedrive", "test", **overrides)


def test_registry_sizes_and_metadata() -> None:
    spec = get_spec("sparsedrive")
    assert set(spec.sizes) == {"small", "test"} and spec.default_size == "small"
    assert spec.meta["input_size"] == (704, 256)
    assert len(spec.meta["detection_classes"]) == 10 and len(spec.meta["map_classes"]) == 3
    with pytest.raises(ValueError, match="stage"):
        create_model("sparsedrive", "test", stage=3)


@pytest.mark.parametrize("stage, analytic", [(1, 75.7e6), (2, 86.1e6)])
def test_small_parameter_count_is_close_to_upstream(stage: int, analytic: float) -> None:
    net = create_model("sparsedrive", "small", stage=stage)
    count = sum(p.numel() for p in net.parameters())
    print(f"sparsedrive small stage {stage}: {count / 1e6:.2f}M parameters (models.md: {analytic / 1e6:.1f}M)")
    assert abs(count - analytic) / analytic < 0.01
    assert (net.motion_head is None) == (stage == 1)


def test_output_shapes_and_finite_losses() -> None:
    net = _test_model()
    net.train()
    batch = make_sequence(1, batch_size=2)[0]
    out = net(batch)
    assert len(out.det.classification) == 2
    assert out.det.classification[-1].shape == (2, 24, 10)
    assert out.det.prediction[-1].shape == (2, 24, 11)
    assert out.det.quality[-1].shape == (2, 24, 2)
    assert out.map.prediction[-1].shape == (2, 8, 40) and out.map.classification[-1].shape == (2, 8, 3)
    assert out.motion.motion_reg[-1].shape == (2, 24, 6, 12, 2) and out.motion.motion_cls[-1].shape == (2, 24, 6)
    assert out.motion.plan_reg[-1].shape == (2, 1, 18, 6, 2) and out.motion.plan_status[-1].shape == (2, 1, 10)
    assert [tuple(d.shape) for d in out.depth] == [(2, 6, 16, 44), (2, 6, 8, 22), (2, 6, 4, 11)]
    losses = net.criterion(batch, out)
    expected = {"det_cls", "det_box", "det_cns", "det_yns", "map_cls", "map_line", "motion_cls", "motion_reg",
                "plan_cls", "plan_reg", "plan_status", "depth", "loss"}
    assert set(losses) == expected
    assert all(torch.isfinite(v) for v in losses.values())


def test_stage_one_has_no_motion_terms() -> None:
    net = _test_model(stage=1)
    net.train()
    batch = make_sequence(1, batch_size=2)[0]
    losses = net.criterion(batch, net(batch))
    assert not any(k.startswith(("motion", "plan")) for k in losses)
    assert torch.isfinite(losses["loss"])


def test_every_trainable_parameter_gets_a_gradient() -> None:
    # regression losses of every match (no score gate) and non-uniform aggregation weights, so that
    # even parameters that upstream's zero init leaves without signal on step one are reached
    net = _test_model(loss={"cls_threshold_to_reg": 0.0})
    for head in (net.det_head, net.map_head):
        for dfa in head.dfa:
            torch.nn.init.normal_(dfa.weights_fc.weight, std=0.1)
    net.train()
    frames = make_sequence(2, batch_size=2)
    net(frames[0])  # fill the streaming state so the temporal path runs below
    losses = net.criterion(frames[1], net(frames[1]))
    losses["loss"].backward()
    assert all(p.grad is not None for p in net.parameters() if p.requires_grad)
    # upstream's detection queries start from fixed all-zero features, so the first layer's learned
    # keypoint offsets see a zero input: their weight has a gradient tensor but it is always zero
    zero_input = {"det_head.dfa.0.kps.learnable_fc.weight"}
    missing = [n for n, p in net.named_parameters()
               if p.requires_grad and n not in zero_input and not p.grad.abs().sum() > 0]
    assert not missing, f"no gradient reached: {missing}"
    assert all(torch.isfinite(p.grad).all() for p in net.parameters() if p.grad is not None)
    frozen = {n for n, p in net.named_parameters() if not p.requires_grad}
    assert frozen == {"det_head.bank.instance_feature", "motion_head.queue.ego_anchor", "motion_head.motion_anchor",
                      "motion_head.plan_anchor"}


def test_losses_fall_on_a_short_fixed_sequence() -> None:
    net = _test_model(loss={"cls_threshold_to_reg": 0.0}, grid_mask=False)
    net.train()
    frames = make_sequence(4, batch_size=2, seed=1)
    opt = torch.optim.AdamW([p for p in net.parameters() if p.requires_grad], lr=2e-3)
    history = []
    for _ in range(8):
        net.reset_state()  # each pass over the sequence is an epoch of the streaming sampler
        epoch = []
        for batch in frames:
            losses = net.criterion(batch, net(batch))
            opt.zero_grad()
            losses["loss"].backward()
            opt.step()
            epoch.append({k: float(v.detach()) for k, v in losses.items()})
        history.append({k: sum(e[k] for e in epoch) / len(epoch) for k in epoch[0]})
    first, last = history[0], history[-1]
    assert last["loss"] < 0.8 * first["loss"]
    for term in ("det_cls", "det_box", "map_cls", "map_line", "motion_reg", "plan_reg", "plan_status", "depth"):
        assert last[term] < first[term], f"{term} did not fall: {first[term]:.4f} -> {last[term]:.4f}"


def test_denoising_queries_train_without_disturbing_the_learned_queries() -> None:
    frames = make_sequence(2, batch_size=2)
    plain = _test_model(grid_mask=False)
    noisy = _test_model(grid_mask=False, num_dn_groups=2)
    noisy.load_state_dict(plain.state_dict())
    for net in (plain, noisy):
        net.train()
        for head in (net.det_head, net.map_head):
            for dfa in head.dfa:
                dfa.attn_drop = 0.0  # no randomness besides the noise of the noisy queries
    outs = []
    for net in (plain, noisy):
        net(frames[0])
        outs.append(net(frames[1]))
    for a, b in zip(outs[0].det.prediction, outs[1].det.prediction):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    dn = outs[1].det.dn
    n_gt = max(len(x) for x in frames[1]["gt_boxes_3d"])
    assert dn is not None and dn.prediction[-1].shape == (2, 2 * 2 * n_gt, 11)
    losses = noisy.criterion(frames[1], outs[1])
    assert {"det_dn_cls", "det_dn_box"} <= set(losses) and torch.isfinite(losses["loss"])
    losses["loss"].backward()
    noisy.eval()
    with torch.no_grad():
        assert noisy(frames[1]).det.dn is None  # denoising is a training-time device only


def test_compile_scope_selects_the_units_accel_compiles() -> None:
    """``encoder`` (the code's default) compiles the backbone + FPN; ``aggregation`` (the config's) adds each
    detection and map layer's deformable aggregation; ``anchors`` the detection and map anchor encoders to that;
    ``heads`` adds every head's dense parts by module path (the
    first detection layer has no self attention, the first layers no temporal one); stage 1 has no motion units;
    any other value is refused in one line that names the key and the choices."""
    assert set(_test_model().compile_units()) == {"encoder"}
    net = _test_model(compile_scope="heads")
    units = net.compile_units()
    per_layer = {"det_head": {0: ("dfa", "ffn", "refine"), 1: ("temp_attn", "self_attn", "dfa", "ffn", "refine")},
                 "map_head": {0: ("self_attn", "dfa", "ffn", "refine"),
                              1: ("temp_attn", "self_attn", "dfa", "ffn", "refine")}}
    want = {"encoder", "det_head.anchor_encoder", "map_head.anchor_encoder", "motion_head.refine",
            "motion_head.motion_anchor_encoder", "motion_head.plan_anchor_encoder"}
    want |= {f"{head}.{kind}.{i}" for head, layers in per_layer.items() for i, kinds in layers.items() for kind in kinds}
    want |= {f"motion_head.{kind}.0" for kind in ("temp_attn", "agent_attn", "map_attn", "ffn")}
    assert set(units) == want
    modules = dict(net.named_modules())
    assert all(units[name] is modules[name] for name in want)  # the names are the module paths
    assert not any(name.startswith("motion_head") for name in _test_model(stage=1, compile_scope="heads").compile_units())
    aggregation_net = _test_model(compile_scope="aggregation")  # the config's default
    aggregation = aggregation_net.compile_units()
    assert set(aggregation) == {"encoder"} | {f"{head}.dfa.{i}" for head in ("det_head", "map_head") for i in (0, 1)}
    aggregation_modules = dict(aggregation_net.named_modules())
    assert all(aggregation[name] is aggregation_modules[name] for name in aggregation)
    anchors = _test_model(compile_scope="anchors").compile_units()
    assert set(anchors) == set(aggregation) | {"det_head.anchor_encoder", "map_head.anchor_encoder"}
    with pytest.raises(ValueError,
                       match=r"^compile_scope='all' is not valid; choose one of: encoder, aggregation, anchors, heads$"):
        _test_model(compile_scope="all")


def _compile_head_units(net: torch.nn.Module, backend) -> None:
    """Compile the model's units but the backbone (its compile is covered elsewhere; this keeps the tests quick) as
    ``apply_compile`` does: ``dynamic`` null; run them under ``MULTI_UNIT_RECOMPILE_LIMIT``."""
    for name, module in net.compile_units().items():
        if name != "encoder":
            module.compile(backend=backend, dynamic=None)


GT_KEYS = ("gt_boxes_3d", "gt_labels_3d", "gt_instance_ids", "gt_agent_fut_trajs", "gt_agent_fut_masks")


def _keep_boxes(batch: dict, n: int) -> dict:
    """The batch with each sample's first ``n`` boxes: the denoising queries number 2 x groups x the most boxes."""
    return {**batch, **{key: [x[:n] for x in batch[key]] for key in GT_KEYS}}


def test_heads_compiled_train_like_eager_without_breaks_or_a_graph_per_query_count() -> None:
    """``compile_scope=heads`` with ``aggregation=auto`` and denoising on, its head units compiled as
    ``accel.compile`` compiles them (``dynamic`` null, the multi-unit recompile limit; aot_eager: Dynamo's
    capture and AOTAutograd without Inductor's codegen): over four training steps whose denoising query counts
    differ (3, 1, 4, 2 boxes at most) the losses and gradients are eager's; no unit breaks its graph; the
    aggregation is traced as corner gathers (no ``grid_sample`` in any graph); and the steps after the first
    with history compile nothing, so a new query count reuses the dynamic graphs instead of recompiling."""
    import torch._dynamo
    from torch._dynamo.backends.registry import lookup_backend
    from torch._dynamo.utils import counters

    from drivebench.accel.compile import MULTI_UNIT_RECOMPILE_LIMIT, recompile_report

    def build() -> torch.nn.Module:
        net = _test_model(compile_scope="heads", aggregation="auto", num_dn_groups=2, grid_mask=False)
        for head in (net.det_head, net.map_head):
            for dfa in head.dfa:
                dfa.attn_drop = 0.0  # compiled dropout draws other masks (the test size has dropout 0 elsewhere)
        return net.train()

    graph_ops: set[str] = set()

    def record_then_aot_eager(gm: torch.fx.GraphModule, example_inputs):
        graph_ops.update(str(node.target) for node in gm.graph.nodes if node.op == "call_function")
        return lookup_backend("aot_eager")(gm, example_inputs)

    frames = [_keep_boxes(f, n) for f, n in zip(make_sequence(4, batch_size=2), (3, 1, 4, 2))]
    graphs_after: list[int] = []

    def train(net: torch.nn.Module) -> tuple[list[torch.Tensor], list[dict[str, torch.Tensor]]]:
        """Each step's loss and gradients (no optimizer step: the streaming state alone carries over)."""
        losses, grads = [], []
        for step, batch in enumerate(frames):
            torch.manual_seed(step)  # the same denoising noise for both models
            net.zero_grad()
            loss = net.criterion(batch, net(batch))["loss"]
            loss.backward()
            losses.append(loss.detach())
            grads.append({n: p.grad.clone() for n, p in net.named_parameters() if p.grad is not None})
            graphs_after.append(int(counters["stats"].get("unique_graphs", 0)))
        return losses, grads

    eager = build()
    ref_losses, ref_grads = train(eager)
    compiled = build()
    compiled.load_state_dict(eager.state_dict())
    torch._dynamo.reset()
    counters.clear()
    graphs_after.clear()
    _compile_head_units(compiled, record_then_aot_eager)
    with torch._dynamo.config.patch(recompile_limit=MULTI_UNIT_RECOMPILE_LIMIT):  # as apply_compile sets it
        losses, grads = train(compiled)

    assert sum(counters["graph_break"].values()) == 0, dict(counters["graph_break"])
    dn_counts = [2 * 2 * max(len(x) for x in batch["gt_boxes_3d"]) for batch in frames]
    assert len(set(dn_counts[1:])) == 3  # the steps with history see three denoising query counts
    assert graphs_after[1] == graphs_after[-1], graphs_after  # no graph for a new query count after step 2
    report = recompile_report()
    assert all(frame["recompiles"] < MULTI_UNIT_RECOMPILE_LIMIT - 1 for frame in report["frames"]), report
    assert graphs_after[-1] <= 40, (graphs_after, report)  # 34 on torch 2.14: one per structural variant
    assert not any("grid_sample" in op for op in graph_ops) and any("floor" in op for op in graph_ops)
    torch.testing.assert_close(torch.stack(losses), torch.stack(ref_losses), rtol=1e-5, atol=1e-5)
    # the corner gathers' float32 gradients at the keypoints differ from grid_sample's by up to ~1.5e-3 of a
    # parameter's largest gradient on the first step (~4e-5 with grid_sample in the units too)
    for step, (got, want_step) in enumerate(zip(grads, ref_grads)):
        assert got.keys() == want_step.keys() and len(got) > 100
        for name, want in want_step.items():
            torch.testing.assert_close(got[name], want, rtol=1e-3, atol=5e-3 * float(want.abs().max()) + 1e-7,
                                       msg=lambda m: f"step {step}, grad of {name}: {m}")


def test_aggregation_units_compile_a_graph_per_head_not_per_layer() -> None:
    """``compile_scope=aggregation`` (the config's default) over three training steps at batch 2: the ``dfa`` units
    (six a head in ``small``, two at the test size) share their graphs, one a head plus one variant, with no break
    and no recompile for strides: the instance bank hands out contiguous queries, where a stride-0 view
    of its parameters gave the first layer of each head a graph of its own (4 graphs, 3 recompiles before)."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    from drivebench.accel.compile import MULTI_UNIT_RECOMPILE_LIMIT, recompile_report

    net = _test_model(compile_scope="aggregation", aggregation="auto").train()
    torch._dynamo.reset()
    counters.clear()
    _compile_head_units(net, "aot_eager")
    with torch._dynamo.config.patch(recompile_limit=MULTI_UNIT_RECOMPILE_LIMIT):
        for batch in make_sequence(3, batch_size=2):
            net.zero_grad()
            net.criterion(batch, net(batch))["loss"].backward()
    assert sum(counters["graph_break"].values()) == 0, dict(counters["graph_break"])
    reasons = [reason for frame in recompile_report()["frames"] for reason in frame["reasons"]]
    assert not any("stride" in reason for reason in reasons), reasons
    assert int(counters["stats"]["unique_graphs"]) <= 3, reasons


def test_compiled_head_graphs_hold_no_tensor_constants() -> None:
    """Every head unit ``compile_scope=heads`` compiles (a superset of ``aggregation``'s), traced through
    AOTAutograd over a training step, holds no tensor constant: a graph with one (a list index such as
    ``anchor[..., [L, W, H]]`` becomes one) cannot be saved by the AOTAutograd cache on a GPU ("unable to serialize
    compiled graph"), so every warm start traced that unit again (b61: the aggregation units, ~25 s of a 50-s warm
    compile on an H100)."""
    import torch._dynamo
    from torch._dynamo.backends.common import aot_autograd

    from drivebench.accel.compile import MULTI_UNIT_RECOMPILE_LIMIT

    constants: list[str] = []

    def record(gm: torch.fx.GraphModule, example_inputs):
        constants.extend(str(node.target) for node in gm.graph.nodes
                         if node.op == "get_attr" and isinstance(getattr(gm, str(node.target), None), torch.Tensor))
        return gm.forward

    net = _test_model(compile_scope="heads", aggregation="auto").train()
    torch._dynamo.reset()
    _compile_head_units(net, aot_autograd(fw_compiler=record, bw_compiler=record))
    with torch._dynamo.config.patch(recompile_limit=MULTI_UNIT_RECOMPILE_LIMIT):
        for batch in make_sequence(2, batch_size=2):
            net.zero_grad()
            net.criterion(batch, net(batch))["loss"].backward()
    assert constants == []
