"""The crop recipes (SparseDrive, GaussianFormer) keep upstream's field of view at every output size.

Their resize ranges are upstream's for 1600-px cameras and upstream's output width (704 px, 1600 px).
Rescaled for the source width alone, SparseDrive's 176-px test output was a 176x64 patch cut from the
bottom of a ~700-px image in training while validation fitted the whole view: no ground-truth box
centre projected into a training image, and detection could not learn at that size.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from drivebench.app import build_run

CONF = Path(__file__).resolve().parents[1] / "drivebench" / "conf"


def _train_and_val_batch(cache: Path, tmp_path: Path, *overrides: str) -> tuple[dict, dict]:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[
            "accel=none", "accel.num_workers=0", "ckpt=none", f"paths.cache={cache}",
            f"paths.output_dir={tmp_path / 'run'}", *overrides])
    datamodule = build_run(cfg, tmp_path / "run", progress=False).datamodule
    datamodule.prepare_data()
    datamodule.setup("fit")
    return next(iter(datamodule.train_dataloader())), next(iter(datamodule.val_dataloader()))


def _image_scale(lidar2img: torch.Tensor) -> torch.Tensor:
    """Per camera, the linear scale of the image transform (focal x resize): sqrt |det| of the 2x2 pixel block,
    which flips and small rotations leave unchanged (rows 0 and 1 = A @ (K R) rows, row 2 the unit depth row)."""
    rows = lidar2img[..., :3, :3].double()
    det = torch.linalg.cross(rows[..., 0, :], rows[..., 1, :], dim=-1).mul(rows[..., 2, :]).sum(-1)
    return det.abs().sqrt()


def _centres_seen(batch: dict) -> float:
    """The share of ground-truth box centres that project inside at least one camera image."""
    h, w = batch["img"].shape[-2:]
    seen, total = 0, 0
    for boxes, lidar2img in zip(batch["gt_boxes_3d"], batch["lidar2img"]):
        centres = torch.cat([boxes[:, :3], torch.ones(len(boxes), 1)], dim=1).double()
        cam = torch.einsum("nij,gj->gni", lidar2img.double(), centres)  # (G, N cameras, 4)
        depth = cam[..., 2]
        u, v = cam[..., 0] / depth.clamp(min=1e-5), cam[..., 1] / depth.clamp(min=1e-5)
        inside = (depth > 0) & (u >= 0) & (u < w) & (v >= 0) & (v < h)
        seen += int(inside.any(dim=1).sum())
        total += len(boxes)
    assert total > 0
    return seen / total


@pytest.mark.parametrize("final_dim", [None, "[32,96]"], ids=["test-size", "smaller-output"])
def test_sparsedrive_trains_on_the_view_it_validates_on(drivebench_cache, tmp_path, final_dim):
    overrides = ["model=sparsedrive"] + ([f"model.inputs.test.final_dim={final_dim}"] if final_dim else [])
    train, val = _train_and_val_batch(drivebench_cache, tmp_path, *overrides)
    ratio = _image_scale(train["lidar2img"]).mean() / _image_scale(val["lidar2img"]).mean()
    # training draws upstream's 0.40-0.47 around the 0.44 that fits 704 px: 0.91-1.07 x validation's fit
    assert 0.85 < float(ratio) < 1.15, float(ratio)
    assert _centres_seen(train) > 0.8 and _centres_seen(val) > 0.8, (_centres_seen(train), _centres_seen(val))


def test_gaussianformer_crops_its_output_from_the_whole_view_at_any_output_width(drivebench_cache, tmp_path):
    # the mini set's cameras are 160 px wide; an 80-px output is half of them (upstream: 1600 of 1600 at 1.0)
    train, val = _train_and_val_batch(drivebench_cache, tmp_path, "model=gaussianformer", "model.inputs.test.final_dim=[40,80]")
    assert train["img"].shape[-2:] == (40, 80)
    ratio = _image_scale(train["lidar2img"]).mean() / _image_scale(val["lidar2img"]).mean()
    assert float(ratio) == pytest.approx(1.0, abs=0.02)
