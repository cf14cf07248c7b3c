#!/usr/bin/env bash
# GPU check for issue 17 item 5 (not yet run; one H200, a second GPU used when present): issue 17 item 5 on CUDA.
# (1) The GPU tests of the checkpoint stager and the device prefetcher (the wrapper's loader state).
# (2) MapTR max with async checkpoints through the StorageCheckpointIO plugin (pinned staging buffers,
#     blocking_s per save), validation on the GPU (the chamfer AP's torchmetrics states on the device),
#     then resume=auto from its step-20 checkpoint in the same ckpt.dir (mid-epoch: the bench set has
#     48 batches per epoch at batch 4).
# (3) With 2 GPUs: the same validation under DDP with NCCL (metric states gathered by torchmetrics
#     over NCCL, which needs them on the device), and a checkpoint every 10 steps on both ranks.
export LIMIT=${LIMIT:-565}; source scripts/device/lib.sh || exit 1
export DRIVEBENCH_EXIT_TIMEOUT_S=20
log "=== GPU tests ($(left)s left)"
timeout 150 python3 -m pytest -q -x -m gpu tests/test_ckpt_store.py tests/test_device_prefetch.py 2>&1 | tail -5 | tee -a "$OUT/log.txt"
M="model=maptr accel=max bench.warmup_steps=5 bench.ceiling=false bench.val_batches=4"
CK="$RUNS/ckpt"
CUDA_VISIBLE_DEVICES=0 run maptr_async 150 $M bench.steps=35 ckpt=async ckpt.dir=$CK ckpt.every_n_steps=20 ckpt.keep_last_k=0
python3 - "$RUNS/maptr_async/summary.json" <<'PY' 2>&1 | tee -a "$OUT/log.txt"
import json, sys
s = json.load(open(sys.argv[1]))
c = s["checkpoints"]
print("saves", [(e["step"], round(e["blocking_s"], 4), round(e["write_s"], 3)) for e in c["each"]],
      "staging_reserved", c["staging_reserved"], "val mAP", s.get("val", {}).get("mAP"))
PY
rm -f "$CK"/step-00000040.ckpt  # resume from step 20 (save_last wrote 40)
CUDA_VISIBLE_DEVICES=0 run maptr_resumed 120 $M bench.steps=35 ckpt=async ckpt.dir=$CK ckpt.every_n_steps=20 resume=auto
grep -h "resumed_from\|Restoring states" "$RUNS/maptr_resumed.log" | head -2 | tee -a "$OUT/log.txt"
if [ "$(python3 -c 'import torch; print(torch.cuda.device_count())')" -ge 2 ]; then
  run maptr_ddp 170 $M bench.steps=30 dist=ddp dist.devices=2 ckpt.every_n_steps=10
else
  log "SKIP maptr_ddp (one GPU)"
fi
bundle
log "done in $(( $(date +%s) - START ))s"
