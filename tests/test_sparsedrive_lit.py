"""SparseDriveModule: optimizer groups, metrics from a validation pass, streaming state around validation."""

from __future__ import annotations

import functools

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader

from drivebench.lit.sparsedrive import SparseDriveModule
from drivebench.models.registry import create_model
from test_sparsedrive_factory import make_sequence, one_torch_thread  # noqa: F401 (autouse fixture)


def _module(stage: int = 2, **kwargs) -> SparseDriveModule:
    torch.manual_seed(0)
    net = create_model("sparsedrive", "test", stage=stage)
    return SparseDriveModule(net, functools.partial(torch.optim.AdamW, lr=4e-4, weight_decay=1e-3), **kwargs)


@pytest.mark.parametrize("stage, mult", [(1, 0.5), (2, 0.1)])
def test_backbone_learning_rate_follows_the_stage(stage: int, mult: float) -> None:
    module = _module(stage)
    optimizer = module.configure_optimizers()
    backbone = {id(p) for p in module.net.encoder.backbone.parameters()}
    seen = set()
    for group in optimizer.param_groups:
        ids = {id(p) for p in group["params"]}
        seen |= ids
        in_backbone = ids <= backbone
        assert in_backbone or not ids & backbone
        assert group["lr"] == pytest.approx(4e-4 * mult if in_backbone else 4e-4)
        assert group["weight_decay"] == 1e-3
    assert seen == {id(p) for p in module.net.parameters() if p.requires_grad}
    assert _module(stage, backbone_lr_mult=0.3).backbone_lr_mult == 0.3


class _StateWatcher(pl.Callback):
    """Records the detection bank's state object before validation and after it."""

    def __init__(self) -> None:
        self.before_val = []
        self.after_val = []
        self.during_val_first = []

    def on_validation_start(self, trainer, module) -> None:
        if trainer.sanity_checking:
            return
        self.before_val.append(module.net.det_head.bank.state)

    def on_validation_batch_start(self, trainer, module, batch, batch_idx, dataloader_idx=0) -> None:
        if batch_idx == 0 and not trainer.sanity_checking:
            self.during_val_first.append(module.net.det_head.bank.state)

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
        if self.before_val and len(self.after_val) < len(self.before_val):
            self.after_val.append(module.net.det_head.bank.state)


def test_fit_with_mid_epoch_validation_logs_metrics_and_keeps_the_training_streams(tmp_path) -> None:
    module = _module()
    frames = make_sequence(4, batch_size=2)
    loader = DataLoader(frames, batch_size=None, shuffle=False)
    watcher = _StateWatcher()
    trainer = pl.Trainer(max_epochs=1, limit_train_batches=4, limit_val_batches=2, val_check_interval=2,
                         num_sanity_val_steps=0, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
                         callbacks=[watcher])
    trainer.fit(module, loader, loader)
    metrics = trainer.callback_metrics
    for key in ("val/loss", "val/det/mAP", "val/det/NDS", "val/det/mATE", "val/det/mAAE", "val/track/AMOTA",
                "val/track/AMOTP", "val/map/mAP", "val/motion/car_minADE", "val/plan/L2_3s", "val/plan/col_avg"):
        assert key in metrics, f"{key} missing from {sorted(metrics)}"
        assert torch.isfinite(torch.as_tensor(metrics[key]))
    # validation started from an empty state and gave the training streams back afterwards
    assert watcher.before_val and watcher.before_val[0] is not None
    assert watcher.during_val_first[0] is None
    assert watcher.after_val[0] is watcher.before_val[0]


def test_perfect_detections_score_full_car_ap() -> None:
    module = _module()
    module.net.eval()
    batch = make_sequence(1, batch_size=2)[0]
    with torch.no_grad():
        out = module.net(batch)
    # overwrite the last layer with the ground truth of sample 0 (cars only) in the first queries
    from drivebench.models.sparsedrive.boxes import encode_boxes

    for i in range(2):
        boxes = batch["gt_boxes_3d"][i]
        batch["gt_labels_3d"][i] = torch.zeros(len(boxes), dtype=torch.long)
        n = len(boxes)
        out.det.prediction[-1][i, :n, :10] = encode_boxes(boxes)
        out.det.prediction[-1][i, n:, 0] = 200.0  # the other queries lie beyond the evaluated range
        out.det.classification[-1][i] = -10.0
        out.det.classification[-1][i, :n, 0] = 10.0
        out.det.quality[-1][i] = 10.0
    module.reset_metrics()
    module.update_metrics(batch, out)
    result = module.compute_metrics()
    assert result["det/AP/car"] == pytest.approx(1.0)
    assert result["det/mATE"] < 1.0 and 0.0 < result["det/NDS"] <= 1.0
    assert "track/AMOTA" in result  # the stage-2 bank's track ids, scored per scene
    assert "map/mAP" in result and "plan/L2_avg" in result and "plan/cv_L2_avg" in result  # with its reference
    # a scene without CAN bus data (ego status all zeros): no velocity to hold, no constant-velocity reference
    module.reset_metrics()
    module.update_metrics(dict(batch, ego_status=torch.zeros_like(batch["ego_status"])), out)
    result = module.compute_metrics()
    assert "plan/L2_avg" in result and not any(k.startswith("plan/cv_") for k in result)


def test_stage_one_validation_scores_detection_tracking_and_map(tmp_path) -> None:
    module = _module(stage=1)
    loader = DataLoader(make_sequence(3, batch_size=2), batch_size=None, shuffle=False)
    trainer = pl.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=tmp_path)
    metrics = trainer.validate(module, loader, verbose=False)[0]
    for key in ("val/det/NDS", "val/det/mAP", "val/track/AMOTA", "val/track/AMOTP", "val/map/mAP"):
        assert key in metrics, f"{key} missing from {sorted(metrics)}"
    assert not any(k.startswith(("val/plan/", "val/motion/")) for k in metrics)  # no motion head in stage 1


class _AnchorWatcher(pl.Callback):
    """Records whether each deformable aggregation's anchors require grad, in training and in validation."""

    def __init__(self) -> None:
        self.seen: dict[str, set[bool]] = {"train": set(), "val": set()}

    def setup(self, trainer, module, stage) -> None:
        for name, part in module.net.named_modules():
            if name.endswith(".dfa.0") or name.endswith(".dfa.1"):
                part.register_forward_pre_hook(
                    lambda _m, args: self.seen["train" if trainer.training else "val"].add(args[1].requires_grad))


def test_validation_hands_every_aggregation_anchors_of_one_kind(tmp_path) -> None:
    """In a fit's validation (``no_grad``) at batch 1 the bank's first anchors were a view of its parameter that
    still requires grad (``expand(1).contiguous()`` kept the view) and the refined ones do not, so each compiled
    ``dfa`` unit compiled a validation graph for both (a CPU fit at the test size: five validation graphs, three
    since the bank hands out copies); training keeps its anchors' gradients."""
    module = _module()
    train = DataLoader(make_sequence(3, batch_size=2), batch_size=None, shuffle=False)
    val = DataLoader(make_sequence(3, batch_size=1), batch_size=None, shuffle=False)  # one slot per sequence
    watcher = _AnchorWatcher()
    trainer = pl.Trainer(max_epochs=1, limit_train_batches=3, limit_val_batches=3, num_sanity_val_steps=0,
                         accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=tmp_path, callbacks=[watcher])
    trainer.fit(module, train, val)
    assert watcher.seen == {"train": {True}, "val": {False}}
