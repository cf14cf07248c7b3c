#!/usr/bin/env bash
# GPU benchmark, part 4 (not yet run; 2-GPU host): checkpoint cost none/local/async (issue 8), QCNet
# 2 GPUs with P2P off and MapTR on 2 GPUs (issue 7), the nuScenes loader knob table (issue 3), the
# doctor on one GPU (issue 10).
export LIMIT=${LIMIT:-540}; source scripts/device/lib.sh || exit 1
export CUDA_VISIBLE_DEVICES=0
Q="model=qcnet accel=max bench.steps=150 bench.val_batches=0 bench.ceiling=false"
run qcnet_ckpt_none 70 $Q ckpt=none
run qcnet_ckpt_local 70 $Q ckpt=local ckpt.every_n_steps=25 ckpt.keep_last_k=2
run qcnet_ckpt_async 70 $Q ckpt=async ckpt.every_n_steps=25 ckpt.keep_last_k=2
run maptr_loader_none 60 bench=loader model=maptr accel=none bench.loader_batches=30
run maptr_loader_max 60 bench=loader model=maptr accel=max bench.loader_batches=60
unset CUDA_VISIBLE_DEVICES
run qcnet_ddp2_p2p_off 110 model=qcnet accel=max dist=ddp dist.devices=2 dist.p2p=off bench.steps=100 bench.val_batches=0 bench.ceiling=false ckpt=none
run maptr_ddp2 120 model=maptr accel=max dist=ddp dist.devices=2 bench.steps=60 bench.val_batches=0 bench.ceiling=false ckpt=none
if (( $(left) > 60 )); then
  log "=== doctor (1 GPU)"
  CUDA_VISIBLE_DEVICES=0 timeout -k 5 $(( $(left) - 10 )) python3 -m drivebench.doctor model=qcnet --json "$RUNS/doctor_1gpu.json" > "$RUNS/doctor_1gpu.txt" 2>&1
  log "rc=$?"; cat "$RUNS/doctor_1gpu.txt" >> "$OUT/log.txt"; bundle
fi
log "done in $(( $(date +%s) - START ))s"
