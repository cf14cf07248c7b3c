"""MapTRModule: optimizer groups (backbone lr x0.1), metric accumulation, a Lightning smoke run."""

from __future__ import annotations

import functools

import lightning.pytorch as pl
import pytest
import torch

from drivebench.data.device_transfer import DeviceTransferDataModule
from drivebench.lit.maptr import MapTRModule
from drivebench.models import create_model
from drivebench.models.maptr.geometry import normalize_points
from drivebench.models.maptr.synthetic import random_map_batch


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _module(**kwargs) -> MapTRModule:
    torch.manual_seed(0)
    net = create_model("maptr", "test")
    optimizer = functools.partial(torch.optim.AdamW, lr=6e-4, weight_decay=0.01)
    return MapTRModule(net, optimizer, **kwargs)


def test_backbone_learns_at_a_tenth_of_the_rate_and_everything_decays_by_default():
    module = _module(no_weight_decay=("bev_embedding",))
    optimizer = module.configure_optimizers()
    backbone = {id(p) for p in module.net.image_encoder.backbone.parameters()}
    seen = set()
    for group in optimizer.param_groups:
        ids = {id(p) for p in group["params"]}
        seen |= ids
        in_backbone = ids <= backbone
        assert in_backbone or not ids & backbone  # groups never mix backbone and the rest
        assert group["lr"] == pytest.approx(6e-5 if in_backbone else 6e-4)
        has_bev = any(p is module.net.bev_encoder.bev_embedding.weight for p in group["params"])
        assert group["weight_decay"] == (0.0 if has_bev else 0.01)
    trainable = {id(p) for p in module.net.parameters() if p.requires_grad}
    assert seen == trainable


def test_scheduler_starts_from_the_scaled_rates():
    net = create_model("maptr", "test")
    module = MapTRModule(net, functools.partial(torch.optim.AdamW, lr=1e-3),
                         scheduler=functools.partial(torch.optim.lr_scheduler.CosineAnnealingLR, T_max=10))
    sched = module.configure_optimizers()["lr_scheduler"]["scheduler"]
    assert sorted(sched.base_lrs) == pytest.approx([1e-4, 1e-3])


def test_perfect_outputs_score_map_one_and_loss_terms_are_named():
    module = _module()
    batch = random_map_batch(2, (64, 96), seed=3)
    v, c = module.net.num_vec, module.net.num_classes
    logits = torch.full((2, 2, v, c), -6.0)
    pts = torch.zeros(2, 2, v, 20, 2)
    for i, (gt, labels) in enumerate(zip(batch["gt_map_pts"], batch["gt_map_labels"])):
        n = len(labels)
        logits[:, i, torch.arange(n), labels] = 6.0
        pts[:, i, :n] = gt[:, 0]
    outputs = {"cls_logits": logits, "pts": pts, "pts_norm": normalize_points(pts, module.net.pc_range)}
    losses = module.compute_loss(batch, outputs)
    assert {"loss", "loss_cls", "loss_pts", "loss_dir", "d0.loss_cls"} <= set(losses)
    assert float(losses["loss_pts"]) < 1e-4
    module.reset_metrics()
    module.update_metrics(batch, outputs)
    metrics = module.compute_metrics()
    assert metrics["mAP"] == pytest.approx(1.0)
    module.reset_metrics()
    noisy = dict(outputs, pts=outputs["pts"] + 2.0)  # 2 m off in x and y: no match at 1.5 m
    module.update_metrics(batch, noisy)
    assert module.compute_metrics()["mAP"] == pytest.approx(0.0)
    assert module.batch_size(batch) == 2


def test_lightning_fit_and_validate_run(tmp_path):
    module = _module()
    batches = [random_map_batch(2, (64, 96), seed=s) for s in range(2)]
    loader = torch.utils.data.DataLoader(batches, batch_size=None, shuffle=False)
    trainer = pl.Trainer(accelerator="cpu", max_steps=2, limit_val_batches=2, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0, default_root_dir=tmp_path)
    trainer.fit(module, loader, loader)
    logged = trainer.callback_metrics
    assert "val/mAP" in logged and "val/AP_divider@0.5" in logged and "val/loss" in logged
    assert torch.isfinite(logged["train/loss"])


def test_jpeg_bytes_stay_on_the_host_while_the_rest_moves():
    """nvjpeg reads host buffers: shipping the bytes to the device would need a blocking copy back."""
    jpegs = [[torch.randint(0, 255, (100,), dtype=torch.uint8) for _ in range(2)]]
    batch = {"img_jpeg": jpegs, "lidar2img": torch.eye(4)[None, None].repeat(1, 2, 1, 1)}
    moved = DeviceTransferDataModule().transfer_batch_to_device(batch, torch.device("meta"), 0)
    assert moved["lidar2img"].device.type == "meta"
    assert moved["img_jpeg"] is jpegs and all(t.device.type == "cpu" for t in moved["img_jpeg"][0])
