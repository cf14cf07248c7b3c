"""Draw a SparseDrive training batch's ground-truth boxes, projected with the batch's lidar2img, on the six images of
its first sample (red: w along the box's x axis, green: l along it, nuScenes' convention).
python sd_boxes.py data.image_size=[640,360] model.size=small [val]"""
import sys
from pathlib import Path

import cv2
import numpy as np
import torch
from drivebench.app import build_run
from drivebench.compose import compose

cfg = compose(["model=sparsedrive", "data.size=bench", "accel=none", "accel.num_workers=0", "ckpt=none",
               "paths.output_dir=/tmp/probe-run", *(a for a in sys.argv[1:] if a != "val")])
datamodule = build_run(cfg, Path("/tmp/probe-run"), progress=False).datamodule
datamodule.prepare_data()
datamodule.setup("fit")
split = "val" if "val" in sys.argv else "train"
loader = datamodule.val_dataloader() if split == "val" else datamodule.train_dataloader()
batch = next(iter(loader))
print({k: (tuple(v.shape) if hasattr(v, "shape") else type(v).__name__) for k, v in batch.items()})
img = batch["img"][0].float()  # (N, 3, H, W)
mean = torch.tensor([123.675, 116.28, 103.53]).view(3, 1, 1)
std = torch.tensor([58.395, 57.12, 57.375]).view(3, 1, 1)
boxes = batch["gt_boxes_3d"][0].double()
print("boxes", boxes.shape, boxes[:3])
x, y, z, w, l, h = (boxes[:, i] for i in range(6))
yaw = boxes[:, 6]
tiles = []
for n in range(img.shape[0]):
    im = img[n] * std + mean if img[n].max() < 20 else img[n]
    im = im.clamp(0, 255).permute(1, 2, 0).numpy().astype(np.uint8).copy()
    im = np.ascontiguousarray(im[..., ::-1]) if "rgb" in sys.argv else im
    P = batch["lidar2img"][0][n].double()
    for g in range(len(boxes)):
        for variant, col in (("wl", (0, 0, 255)), ("lw", (0, 255, 0))):
            c, s = torch.cos(yaw[g]), torch.sin(yaw[g])
            a, b = (w[g], l[g]) if variant == "wl" else (l[g], w[g])
            pts = []
            for sx in (-1, 1):
                for sy in (-1, 1):
                    for sz in (-1, 1):
                        px, py = sx * a / 2, sy * b / 2
                        pts.append([x[g] + c * px - s * py, y[g] + s * px + c * py, z[g] + sz * h[g] / 2, 1.0])
            pts = torch.tensor(pts, dtype=torch.float64)
            cam = pts @ P.T
            if (cam[:, 2] <= 0.1).any():
                continue
            uv = (cam[:, :2] / cam[:, 2:3]).numpy().astype(int)
            for i in range(8):
                for j in range(i + 1, 8):
                    if bin(i ^ j).count("1") == 1:
                        cv2.line(im, tuple(uv[i]), tuple(uv[j]), col, 1)
    tiles.append(im)
grid = np.concatenate([np.concatenate(tiles[:3], 1), np.concatenate(tiles[3:6], 1)], 0)
out = f"{split}-boxes.jpg"
cv2.imwrite(out, grid, [cv2.IMWRITE_JPEG_QUALITY, 85])
print(out, grid.shape)
