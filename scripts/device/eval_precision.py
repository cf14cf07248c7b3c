"""The same QCNet weights validated at fp32 and at bf16 autocast (each with TF32 off and on): does the precision of
the validation alone move val minFDE? QCNet's `max` runs trail `none` by ~0.2-0.3 m of val minFDE at every epoch
while their train and val losses match (b29-b45), which an evaluation rounding would explain and a training
difference would not separate from.

    python scripts/device/eval_precision.py EPOCHS [drivebench overrides...]

Trains EPOCHS epochs at accel=none (no validation, no checkpoint), then validates the weights five times: fp32,
fp32+TF32, bf16, bf16+TF32, fp32 again (the last against the first: the run-to-run noise of the GPU's
reductions). Prints one JSON line per validation.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import lightning.pytorch as pl
import torch

from drivebench.app import build_run, quiet_third_party_noise
from drivebench.compose import compose

KEYS = ("val/minFDE", "val/minADE", "val/MR", "val/loss", "val/reg_loss_refine", "val/cls_loss", "val/cv_minFDE")


def main() -> None:
    epochs, overrides = int(sys.argv[1]), sys.argv[2:]
    quiet_third_party_noise()
    cfg = compose(["+experiment=convergence", "model=qcnet", "accel=none", "seed=2024", "ckpt=none", *overrides])
    run = build_run(cfg, Path("/tmp/eval-precision"), progress=False)
    base = run.trainer_kwargs()
    quiet = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False)
    t0 = time.time()
    pl.Trainer(**base, **quiet, max_epochs=epochs, limit_val_batches=0).fit(run.module, datamodule=run.datamodule)
    print(json.dumps({"trained_epochs": epochs, "train_s": round(time.time() - t0, 1)}), flush=True)
    for precision, tf32 in (("32-true", False), ("32-true", True), ("bf16-mixed", False), ("bf16-mixed", True),
                            ("32-true", False)):
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
        trainer = pl.Trainer(**{**base, "precision": precision}, **quiet)
        values = trainer.validate(run.module, datamodule=run.datamodule, verbose=False)[0]
        print(json.dumps({"precision": precision, "tf32": tf32,
                          **{k: round(float(values[k]), 4) for k in KEYS if k in values}}), flush=True)


if __name__ == "__main__":
    main()
