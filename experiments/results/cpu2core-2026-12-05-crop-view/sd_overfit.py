"""Overfit SparseDrive (test size) on one real bench batch: can detection learn at all?"""
import sys, time, torch, numpy as np
from pathlib import Path
from types import SimpleNamespace
from hydra import compose, initialize_config_dir
import drivebench
from drivebench.app import build_run
from drivebench.models.sparsedrive.decode import decode_detections
CONF = Path(drivebench.__file__).parent / "conf"
steps = int(sys.argv[1]); extra = sys.argv[2:]
with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
    cfg = compose(config_name="config", overrides=["model=sparsedrive", "data.size=bench", "data.image_size=[640,360]",
        "accel=none", "accel.num_workers=0", "ckpt=none", "paths.output_dir=/tmp/probe-run", "model.scheduler=null", *extra])
run = build_run(cfg, Path("/tmp/probe-run"), progress=False)
dm, module = run.datamodule, run.module
dm.prepare_data(); dm.setup("fit")
module.trainer = SimpleNamespace(datamodule=dm)  # the k-means anchors' setup reads trainer.datamodule
module.setup("fit")
batch = next(iter(dm.train_dataloader()))
print("gt per sample", [len(b) for b in batch["gt_boxes_3d"]], "labels", [np.bincount(l.numpy(), minlength=10).tolist() for l in batch["gt_labels_3d"]][:1])
print("gt dist from ego (median, max)", [(float(b[:, :2].norm(dim=1).median()), float(b[:, :2].norm(dim=1).max())) for b in batch["gt_boxes_3d"]][:2])
opt = module.configure_optimizers()
opt = opt["optimizer"] if isinstance(opt, dict) else (opt[0][0] if isinstance(opt, tuple) else opt)
module.train()
t0 = time.time()
for s in range(steps):
    module.net.reset_state()
    out = module.net(batch)
    losses = module.compute_loss(batch, out)
    opt.zero_grad(); losses["loss"].backward()
    torch.nn.utils.clip_grad_norm_(module.parameters(), 25); opt.step()
    if s % max(1, steps // 10) == 0 or s == steps - 1:
        print(s, {k: round(float(v), 3) for k, v in losses.items() if k.startswith("det") or k == "loss"}, f"{time.time()-t0:.0f}s", flush=True)
module.eval(); module.net.reset_state()
with torch.no_grad():
    out = module.net(batch)
    dets = decode_detections(out.det, module.num_detections)
for i in range(min(2, len(batch["gt_boxes_3d"]))):
    gt = batch["gt_boxes_3d"][i][:, :3]; pb = dets.boxes[i][:, :3]; sc = dets.scores[i]
    d = torch.cdist(gt[:, :2], pb[:, :2])
    print(f"sample {i}: {len(gt)} gt, {len(pb)} preds; gt->nearest pred (any score) median {d.min(1).values.median():.2f} m;"
          f" top-10 preds->nearest gt {d.min(0).values[sc.argsort(descending=True)[:10]].numpy().round(2)}; scores {sc.sort(descending=True).values[:5].numpy().round(3)}")
module.reset_metrics(); module.update_metrics(batch, out)
r = module.compute_metrics(); print({k: round(v, 4) for k, v in r.items() if k.startswith("det/") and ("mAP" in k or "AP/car" in k or "AP/ped" in k or "mATE" in k)})
