#!/usr/bin/env bash
# GPU benchmark, part 6 (not yet run; 2-GPU host, single-GPU runs pinned to GPU 0): what parts 3-5
# left out. MapTR accel=cpu / accel=torch (issue 4), MapTR on 1 vs 2 GPUs (issue 7), MapTR checkpoint
# cost with repeats interleaved so run-to-run noise is visible (issue 8), the two loader knobs not yet
# measured alone (issue 3), the doctor on one GPU (issue 10). Each process now exits within 60 s of
# its summary (exit watchdog; status 3 + thread stacks in <run>.log if it had to force the exit).
export LIMIT=${LIMIT:-560}; source scripts/device/lib.sh || exit 1
export DRIVEBENCH_EXIT_TIMEOUT_S=20
export CUDA_VISIBLE_DEVICES=0
M="model=maptr bench.val_batches=0 ckpt=none"
run maptr_torch 110 $M accel=torch bench.steps=60 bench.ceiling=false
run maptr_cpu 80 $M accel=cpu bench.steps=30 bench.ceiling=false
C="model=maptr accel=max bench.steps=96 bench.val_batches=0 bench.ceiling=false"
run maptr_ckpt_none_a 75 $C ckpt=none
run maptr_ckpt_async_a 75 $C ckpt=async ckpt.every_n_steps=24 ckpt.keep_last_k=2
run maptr_ckpt_none_b 75 $C ckpt=none
run maptr_ckpt_async_b 75 $C ckpt=async ckpt.every_n_steps=24 ckpt.keep_last_k=2
L="bench=loader model=maptr"
run loader_shm_cache 60 $L accel=none accel.shm_cache=true accel.preprocess_workers=16 bench.loader_batches=20
run loader_device_images 40 $L accel=none accel.device_transform=images bench.loader_batches=10
unset CUDA_VISIBLE_DEVICES
run maptr_ddp2 110 model=maptr accel=max dist=ddp dist.devices=2 bench.steps=60 bench.val_batches=0 bench.ceiling=false ckpt=none
if (( $(left) > 40 )); then
  log "=== doctor (1 GPU)"
  CUDA_VISIBLE_DEVICES=0 timeout -k 5 $(( $(left) - 8 )) python3 -m drivebench.doctor model=qcnet --json "$RUNS/doctor_1gpu.json" > "$RUNS/doctor_1gpu.txt" 2>&1
  log "rc=$?"; cat "$RUNS/doctor_1gpu.txt" >> "$OUT/log.txt"; bundle
fi
log "done in $(( $(date +%s) - START ))s"
