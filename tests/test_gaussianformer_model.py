"""GaussianFormer end to end on CPU at the ``test`` size: contract, gradients, training, Lightning module."""

from __future__ import annotations

import math
import time

import pytest
import torch

from drivebench.models import create_model, get_spec

# FRONT, FRONT_RIGHT, FRONT_LEFT, BACK, BACK_LEFT, BACK_RIGHT (the contract's camera order)
NUSCENES_CAM_YAWS_DEG = (0.0, -55.0, 55.0, 180.0, 110.0, -110.0)


def _camera_matrices(h: int, w: int, yaw_deg: float, height: float = 1.6) -> tuple[torch.Tensor, torch.Tensor]:
    """(cam2lidar 4x4, intrinsic 3x3) of a pinhole camera at ``height``, 70 deg fov, turned ``yaw`` to the left
    of the vehicle's forward direction; LIDAR_TOP as the contract has it: x right, y forward, z up."""
    yaw = math.radians(yaw_deg)
    forward = torch.tensor([-math.sin(yaw), math.cos(yaw), 0.0])
    right = torch.tensor([math.cos(yaw), math.sin(yaw), 0.0])
    down = torch.tensor([0.0, 0.0, -1.0])
    cam2lidar = torch.eye(4)
    cam2lidar[:3, :3] = torch.stack([right, down, forward], dim=1)  # columns: camera x, y, z in lidar frame
    cam2lidar[:3, 3] = torch.tensor([0.0, 0.0, height])
    f = 0.5 * w / math.tan(math.radians(35.0))
    intrinsic = torch.tensor([[f, 0.0, 0.5 * w], [0.0, f, 0.5 * h], [0.0, 0.0, 1.0]])
    return cam2lidar, intrinsic


def synthetic_occupancy(grid_shape: tuple[int, int, int], generator: torch.Generator) -> torch.Tensor:
    """Empty (17) everywhere, a drivable ground plane (11) on the lowest layer and a few class boxes on it."""
    x, y, z = grid_shape
    label = torch.full(grid_shape, 17, dtype=torch.long)
    label[:, :, 0] = 11
    for cls in (4, 15, 7, 16):  # car, manmade, pedestrian, vegetation
        sx, sy = (int(v) for v in torch.randint(2, max(3, x // 4), (2,), generator=generator))
        x0 = int(torch.randint(0, x - sx, (1,), generator=generator))
        y0 = int(torch.randint(0, y - sy, (1,), generator=generator))
        top = int(torch.randint(2, z + 1, (1,), generator=generator))
        label[x0:x0 + sx, y0:y0 + sy, 1:top] = cls
    return label


def make_batch(batch_size: int = 2, image_hw: tuple[int, int] = (64, 96), grid_shape=(20, 20, 4),
               seed: int = 0, num_cams: int = 6) -> dict:
    """A random batch with every camera-model key of ``docs/batch-contract.md`` plus occupancy labels."""
    gen = torch.Generator().manual_seed(seed)
    h, w = image_hw
    cams = [_camera_matrices(h, w, yaw) for yaw in NUSCENES_CAM_YAWS_DEG[:num_cams]]
    cam2lidar = torch.stack([c for c, _ in cams])
    intrinsic = torch.stack([k for _, k in cams])
    viewpad = torch.eye(4).repeat(num_cams, 1, 1)
    viewpad[:, :3, :3] = intrinsic
    lidar2img = viewpad @ torch.linalg.inv(cam2lidar)
    rep = lambda t: t.unsqueeze(0).repeat(batch_size, *([1] * t.dim()))  # noqa: E731
    labels = torch.stack([synthetic_occupancy(tuple(grid_shape), gen) for _ in range(batch_size)])
    return {
        "img": torch.randn(batch_size, num_cams, 3, h, w, generator=gen),
        "img_shape": torch.tensor([h, w]).repeat(batch_size, num_cams, 1),
        "lidar2img": rep(lidar2img),
        "cam_intrinsic": rep(intrinsic),
        "cam2lidar": rep(cam2lidar),
        "lidar2ego": torch.eye(4).repeat(batch_size, 1, 1),
        "ego2global": torch.eye(4).repeat(batch_size, 1, 1),
        "can_bus": torch.zeros(batch_size, 18),
        "timestamp": torch.arange(batch_size, dtype=torch.float64),
        "sequence_id": torch.zeros(batch_size, dtype=torch.long),
        "frame_idx": torch.arange(batch_size),
        "prev_exists": torch.zeros(batch_size, dtype=torch.bool),
        "occ_label": labels,
        "occ_mask": torch.ones_like(labels, dtype=torch.bool),
    }


@pytest.fixture(scope="module", autouse=True)
def single_thread():
    """Tiny tensors gain nothing from intra-op threads, and on a shared 2-core box the thread pool's
    barriers under contention make each step ~10x slower; restore the setting afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny_model():
    torch.manual_seed(0)
    return create_model("gaussianformer", "test")


def test_registry_sizes_and_metadata():
    spec = get_spec("gaussianformer")
    assert spec.default_size == "gs25600"
    assert set(spec.sizes) >= {"gs25600", "gs144000", "test"}
    for size in ("gs25600", "gs144000"):
        cfg = spec.sizes[size]
        assert cfg["image_size"] == (864, 1600)
        assert cfg["grid_shape"] == (200, 200, 16) and cfg["voxel_size"] == 0.5 and cfg["num_classes"] == 18
    assert spec.meta["task"] == "occupancy"
    with pytest.raises(ValueError, match="not a size"):
        create_model("gaussianformer", "gs1")


@pytest.mark.parametrize("size, low, high", [("gs25600", 56.8e6, 57.3e6), ("gs144000", 75.2e6, 75.7e6),
                                             ("gs25600_r50", 35.9e6, 36.6e6)])
def test_paper_sizes_parameter_counts(size, low, high):
    """models.md: ~57.0M and ~75.5M with R101-DCN (BN affine counted: trained from random init, as upstream's)."""
    with torch.device("meta"):
        net = create_model("gaussianformer", size)
    total = sum(p.numel() for p in net.parameters())
    assert low < total < high, total
    assert not net.lifter.instance_feature.requires_grad  # frozen, as upstream


def test_forward_contract_batch_of_two(tiny_model):
    batch = make_batch(2)
    tiny_model.train()
    out = tiny_model(batch)
    grid = tiny_model.grid.shape
    assert len(out["occ_logits"]) == len(tiny_model.blocks)  # loss_layers="all" in the test size
    for logits in out["occ_logits"]:
        assert logits.shape == (2, 18, *grid) and torch.isfinite(logits).all()
    assert out["occ_pred"].shape == (2, *grid) and out["occ_pred"].dtype == torch.long
    last = out["gaussians"][-1]
    lo, hi = torch.tensor(tiny_model.grid.lower), torch.tensor(tiny_model.grid.upper)
    assert ((last.means >= lo) & (last.means <= hi)).all()
    assert last.means.shape == (2, 200, 3) and last.semantics.shape == (2, 200, 17)
    tiny_model.eval()
    with torch.no_grad():
        assert len(tiny_model(batch)["occ_logits"]) == 1  # eval: last layer only


def test_samples_of_a_batch_do_not_interact(tiny_model):
    tiny_model.eval()
    batch = make_batch(2, seed=5)
    batch["img"][1] = torch.randn_like(batch["img"][1])
    single = {k: (v[:1] if isinstance(v, torch.Tensor) else v) for k, v in batch.items()}
    with torch.no_grad():
        both = tiny_model(batch)["occ_logits"][-1]
        alone = tiny_model(single)["occ_logits"][-1]
    torch.testing.assert_close(both[:1], alone, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(both[0], both[1])


def test_every_trainable_parameter_gets_a_gradient(tiny_model):
    """All trainable parameters are in the graph; with upstream's zero-initialised attention weights
    (``weights_fc``) randomised, every gradient is non-zero too, except block 1's learnable keypoint
    weight, whose input is the frozen all-zero instance feature (as upstream)."""
    from drivebench.models.gaussianformer.losses import OccupancyLoss

    saved = {k: v.clone() for k, v in tiny_model.state_dict().items()}
    for block in tiny_model.blocks:
        torch.nn.init.normal_(block.aggregation.weights_fc.weight, std=0.1)
    tiny_model.train()
    tiny_model.zero_grad(set_to_none=True)
    batch = make_batch(2, seed=1)
    out = tiny_model(batch)
    OccupancyLoss()(out["occ_logits"], batch["occ_label"], batch["occ_mask"])["loss"].backward()
    trainable = {n: p for n, p in tiny_model.named_parameters() if p.requires_grad}
    assert not [n for n, p in trainable.items() if p.grad is None]
    assert all(torch.isfinite(p.grad).all() for p in trainable.values())
    zero = {n for n, p in trainable.items() if p.grad.abs().sum() == 0}
    assert zero == {"blocks.0.aggregation.keypoints.learnable_fc.weight"}, zero
    frozen = [n for n, p in tiny_model.named_parameters() if not p.requires_grad]
    assert "lifter.instance_feature" in frozen and any(n.startswith("image_encoder.backbone.stem") for n in frozen)
    tiny_model.load_state_dict(saved)
    tiny_model.zero_grad(set_to_none=True)


def test_baseline_variant_without_opacity_and_empty_gaussian():
    """gs144000's layout: 18 raw semantics, no opacity, no empty Gaussian, checkpointed aggregation."""
    net = create_model("gaussianformer", "test", include_opacity=False, semantics_activation="identity",
                       with_empty=False, sparse_out_proj=False, num_gaussians=64, aggregation_checkpoint=True)
    out = net(make_batch(1))
    assert out["gaussians"][0].opacities.shape[-1] == 0 and out["gaussians"][0].semantics.shape[-1] == 18
    sum(o.sum() for o in out["occ_logits"]).backward()
    assert net.lifter.anchor.grad is not None
    assert net.blocks[1].aggregation.keypoints.learnable_fc.weight.grad.abs().sum() > 0


def test_tiny_model_overfits_a_fixed_batch():
    from drivebench.models.gaussianformer.losses import OccupancyLoss

    torch.manual_seed(0)
    net = create_model("gaussianformer", "test")
    batch = make_batch(1, seed=2)
    crit = OccupancyLoss()
    opt = torch.optim.AdamW([p for p in net.parameters() if p.requires_grad], lr=1e-2, weight_decay=0.01)
    losses = []
    steps = 15
    start = time.perf_counter()
    for _ in range(steps):
        loss = crit(net(batch)["occ_logits"], batch["occ_label"], batch["occ_mask"])["loss"]
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    print(f"test size: {(time.perf_counter() - start) / steps:.3f} s per training step (batch 1)")
    assert all(math.isfinite(v) for v in losses)
    assert sum(losses[-3:]) / 3 < 0.75 * sum(losses[:3]) / 3, losses


def test_lightning_module_loss_metrics_and_param_groups(tiny_model):
    from functools import partial

    from drivebench.lit.gaussianformer import GaussianFormerModule

    module = GaussianFormerModule(tiny_model, optimizer=partial(torch.optim.AdamW, lr=2e-4, weight_decay=0.01))
    batch = make_batch(2, seed=3)
    tiny_model.train()
    losses = module.compute_loss(batch, module(batch))
    assert {"loss", "loss_ce", "loss_lovasz"} <= set(losses) and losses["loss"].requires_grad
    assert module.batch_size(batch) == 2

    tiny_model.eval()
    module.reset_metrics()
    with torch.no_grad():
        module.update_metrics(batch, module(batch))
    metrics = module.compute_metrics()
    assert 0.0 <= metrics["miou"] <= 100.0 and 0.0 <= metrics["iou"] <= 100.0

    opt = module.configure_optimizers()
    backbone = {id(p) for p in tiny_model.image_encoder.backbone.parameters() if p.requires_grad}
    seen = 0
    for group in opt.param_groups:
        in_backbone = {id(p) in backbone for p in group["params"]}
        assert len(in_backbone) == 1  # no group mixes backbone and the rest
        assert group["lr"] == pytest.approx(2e-5 if in_backbone.pop() else 2e-4)
        seen += len(group["params"])
    assert seen == sum(1 for p in tiny_model.parameters() if p.requires_grad)


def test_lightning_fit_and_validate_one_batch(tiny_model):
    from functools import partial

    import lightning.pytorch as pl

    from drivebench.lit.gaussianformer import GaussianFormerModule

    batch = make_batch(1, seed=4)
    loader = torch.utils.data.DataLoader([batch], batch_size=None)
    module = GaussianFormerModule(tiny_model, optimizer=partial(torch.optim.AdamW, lr=1e-4))
    trainer = pl.Trainer(fast_dev_run=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, train_dataloaders=loader, val_dataloaders=loader)
    assert {"train/loss", "val/loss", "val/miou", "val/iou"} <= set(trainer.callback_metrics)
    assert all(math.isfinite(float(v)) for v in trainer.callback_metrics.values())


@pytest.mark.slow
def test_real_nuscenes_batch_from_the_data_layer(tmp_path):
    """A batch of the generated nuScenes mini set through the real GaussianFormer pipeline: the model's
    projection convention agrees with the data layer's lidar2img / img_shape (Gaussians spread over the
    scene are seen by the cameras) and the loss on the full SurroundOcc grid trains."""
    from drivebench.data.nuscenes.generate import ensure_generated
    from drivebench.data.nuscenes.infos import build_infos
    from drivebench.data.transforms import NuScenesDataset, collate, gaussianformer_pipeline
    from drivebench.models.gaussianformer.deformable import project_to_cameras
    from drivebench.models.gaussianformer.losses import OccupancyLoss

    root = ensure_generated(tmp_path / "mini", "mini", seed=0, workers=2, progress=False)
    index = build_infos(root, cache_dir=tmp_path / "cache")
    dataset = NuScenesDataset(index, gaussianformer_pipeline(root, final_dim=(96, 160), rand_flip=False), root=root)
    batch = collate([dataset[0]])
    torch.manual_seed(0)
    net = create_model("gaussianformer", "test", grid_shape=(200, 200, 16), grid_lower=(-50.0, -50.0, -5.0),
                       voxel_size=0.5, sparse_voxel_size=0.5, scale_range=(0.08, 0.32), empty_scale=(100.0, 100.0, 8.0),
                       num_gaussians=1000, loss_layers="last")
    out = net(batch)
    means = out["gaussians"][0].means
    _, visible = project_to_cameras(means.unsqueeze(2), batch["lidar2img"], batch["img_shape"],
                                    tuple(batch["img"].shape[-2:]))
    assert visible.any(-1).float().mean() > 0.9
    assert (visible.flatten(0, 2).float().mean(0) > 0.05).all()  # every camera sees part of the scene
    losses = OccupancyLoss()(out["occ_logits"], batch["occ_label"], batch["occ_mask"])
    losses["loss"].backward()
    assert torch.isfinite(losses["loss"]) and 0 < losses["loss_lovasz"] <= 1
    assert torch.isfinite(net.lifter.anchor.grad).all() and net.lifter.anchor.grad.abs().sum() > 0


def test_encoder_compile_scope_units_compile_and_keep_the_numbers():
    """``compile_scope=encoder`` adds the static-shape encoder parts; compiled (aot_eager: the graph
    capture and autograd of torch.compile without Inductor's codegen) they give eager's outputs."""
    torch.manual_seed(0)
    net = create_model("gaussianformer", "test", compile_scope="encoder").eval()
    units = net.compile_units()
    assert set(units) == {"image_encoder", "anchor_encoder"} | {
        f"blocks.{i}.{part}" for i in range(len(net.blocks)) for part in ("aggregation", "ffn", "refine")}
    assert set(create_model("gaussianformer", "test").compile_units()) == {"image_encoder"}
    with pytest.raises(ValueError, match="compile_scope"):
        create_model("gaussianformer", "test", compile_scope="everything")
    batch = make_batch(1)
    with torch.no_grad():
        eager = net(batch)["occ_logits"][-1]
        for name, module in units.items():
            if name != "image_encoder":  # the backbone's compile is covered elsewhere; keep this quick
                module.compile(backend="aot_eager")
        compiled = net(batch)["occ_logits"][-1]
    torch.testing.assert_close(compiled, eager, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("aggregation_checkpoint", [False, True])
def test_max_encoder_with_the_auto_aggregation_trains_like_eager_grid_sample(aggregation_checkpoint):
    """``max``'s GaussianFormer (b57): ``aggregation=auto`` inside the compiled encoder units, under checkpoint as
    gs144000 runs it or not, traces the corner gathers in (no ``grid_sample`` in any graph, no graph break), and
    the loss and every gradient are those of the eager model, which runs ``grid_sample`` (dropout off: compiled
    dropout draws other masks)."""
    from torch._dynamo.utils import counters

    from drivebench.models.gaussianformer.losses import OccupancyLoss
    from test_deformable_aggregation import op_recorder

    def build() -> torch.nn.Module:
        torch.manual_seed(0)
        net = create_model("gaussianformer", "test", aggregation="auto", compile_scope="encoder",
                           aggregation_checkpoint=aggregation_checkpoint).train()
        for module in net.modules():
            if hasattr(module, "attn_drop"):
                module.attn_drop = 0.0
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
        return net

    batch, criterion = make_batch(2, seed=1), OccupancyLoss()

    def loss_and_grads(net: torch.nn.Module) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        loss = criterion(net(batch)["occ_logits"], batch["occ_label"], batch["occ_mask"])["loss"]
        loss.backward()
        return loss.detach(), {n: p.grad for n, p in net.named_parameters() if p.grad is not None}

    eager = build()
    ref_loss, ref_grads = loss_and_grads(eager)
    compiled = build()
    compiled.load_state_dict(eager.state_dict())
    graph_ops: set[str] = set()
    torch._dynamo.reset()
    counters.clear()
    for name, module in compiled.compile_units().items():
        if name != "image_encoder":  # as above: quick, and the backbone's compile is covered elsewhere
            module.compile(backend=op_recorder(graph_ops))
    loss, grads = loss_and_grads(compiled)
    assert sum(counters["graph_break"].values()) == 0, dict(counters["graph_break"])
    assert not any("grid_sample" in op for op in graph_ops) and any("floor" in op for op in graph_ops), graph_ops
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-5)
    assert grads.keys() == ref_grads.keys() and len(grads) > 50
    for name, want in ref_grads.items():
        torch.testing.assert_close(grads[name], want, rtol=1e-3, atol=1e-3 * float(want.abs().max()) + 1e-7,
                                   msg=lambda m: f"grad of {name}: {m}")
