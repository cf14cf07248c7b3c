#!/usr/bin/env bash
# GPU benchmark, part 12 (not yet run; one H200): async checkpoints again now that the pinned staging
# buffers are reserved after the first optimizer step (part 8 measured the first save at 0.36-0.41 s of
# blocking, later ones at 0.02-0.03 s), interleaved with runs without checkpoints; then QCNet with
# model.net.compile_scope=layers (per-layer compile against its launch-bound eager step).
export LIMIT=${LIMIT:-565}; source scripts/device/lib.sh || exit 1
export DRIVEBENCH_EXIT_TIMEOUT_S=20 CUDA_VISIBLE_DEVICES=0
C="model=maptr accel=max bench.steps=72 bench.val_batches=0 bench.ceiling=false"
K="ckpt.every_n_steps=18 ckpt.keep_last_k=2"
run maptr_ckpt_none_a 75 $C ckpt=none
run maptr_ckpt_async_a 65 $C ckpt=async $K
run maptr_ckpt_none_b 65 $C ckpt=none
run maptr_ckpt_async_b 65 $C ckpt=async $K
Q="model=qcnet accel=max bench.steps=60 bench.val_batches=0 bench.ceiling=false"
run qcnet_max 80 $Q ckpt=none
run qcnet_layers 180 $Q ckpt=none model.net.compile_scope=layers
log "done in $(( $(date +%s) - START ))s"
