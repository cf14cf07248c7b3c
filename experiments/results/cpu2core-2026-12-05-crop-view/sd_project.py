"""Do the ground-truth box centres of a SparseDrive training batch project into the images the network sees?
python sd_project.py [overrides...]   (e.g. data.image_size=[640,360]; the default model size on a CPU is test)"""
import sys
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

import drivebench
from drivebench.app import build_run

CONF = Path(drivebench.__file__).parent / "conf"
with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
    cfg = compose(config_name="config", overrides=["model=sparsedrive", "data.size=bench", "accel=none",
                  "accel.num_workers=0", "ckpt=none", "paths.output_dir=/tmp/probe-run", *sys.argv[1:]])
datamodule = build_run(cfg, Path("/tmp/probe-run"), progress=False).datamodule
datamodule.prepare_data()
datamodule.setup("fit")
batch = next(iter(datamodule.train_dataloader()))
h, w = batch["img"].shape[-2:]
print("images", tuple(batch["img"].shape))
for i in range(2):
    centres = torch.cat([batch["gt_boxes_3d"][i][:, :3], torch.ones(len(batch["gt_boxes_3d"][i]), 1)], 1).double()
    cam = torch.einsum("nij,gj->gni", batch["lidar2img"][i].double(), centres)
    depth = cam[..., 2]
    u, v = cam[..., 0] / depth.clamp(min=1e-5), cam[..., 1] / depth.clamp(min=1e-5)
    inside = (depth > 0) & (u >= 0) & (u < w) & (v >= 0) & (v < h)
    print(f"sample {i}: {int(inside.any(1).sum())} of {len(centres)} ground-truth centres inside some camera; "
          f"per camera {inside.sum(0).tolist()}")
