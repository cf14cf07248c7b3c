#!/usr/bin/env bash
# GPU benchmark, part 2 (2-GPU machine): MapTR accel=max vs none at 1600x900 on GPU 0 (issue 4),
# QCNet DDP on both GPUs (issue 7), the doctor on both GPUs (issue 10).
export LIMIT=${LIMIT:-470}; source scripts/device/lib.sh || exit 1
export CUDA_VISIBLE_DEVICES=0
run maptr_max 200 model=maptr accel=max bench.steps=100 bench.val_batches=5 bench.ceiling_steps=30 bench.ceiling_warmup_steps=5 ckpt=none
unset CUDA_VISIBLE_DEVICES
run qcnet_max_ddp2 130 model=qcnet accel=max dist=ddp dist.devices=2 dist.p2p=on bench.steps=100 bench.val_batches=0 bench.ceiling=false ckpt=none
export CUDA_VISIBLE_DEVICES=0
run maptr_none 110 model=maptr accel=none bench.steps=30 bench.val_batches=0 bench.ceiling_steps=20 bench.ceiling_warmup_steps=5 ckpt=none
unset CUDA_VISIBLE_DEVICES
if (( $(left) > 60 )); then
  log "=== doctor (2 GPUs)"
  timeout -k 5 $(( $(left) - 10 )) python3 -m drivebench.doctor model=qcnet dist=ddp --json "$RUNS/doctor_2gpu.json" > "$RUNS/doctor_2gpu.txt" 2>&1
  log "rc=$?"; cat "$RUNS/doctor_2gpu.txt" >> "$OUT/log.txt"; bundle
fi
log "done in $(( $(date +%s) - START ))s"
