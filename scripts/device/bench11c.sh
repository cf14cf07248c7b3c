#!/usr/bin/env bash
# GPU benchmark, part 11c (one H200, or GPU 0 of two; run right after 11b on the warm machine):
# drivebench at accel=max without compile, the pair of 11b's mmengine run, and once more with its
# then-default compile of the backbone, neck and head (warm Inductor cache) against it.
export LIMIT=${LIMIT:-170}; source scripts/device/lib.sh || exit 1
export DRIVEBENCH_EXIT_TIMEOUT_S=20 CUDA_VISIBLE_DEVICES=0
source scripts/device/openmmlab_stack.sh
mkdir -p "$RUNS/mm"
M="model=mmdet3d bench.steps=30 bench.warmup_steps=5 bench.ceiling=false bench.val_batches=0 ckpt=none"
run mm/7_train_max_nocompile 80 $M accel=max accel.compile=false
run mm/8_train_max 75 $M accel=max
bundle
log "done in $(( $(date +%s) - START ))s"
