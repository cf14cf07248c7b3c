#!/usr/bin/env bash
# GPU benchmark, part 11c (one H200, or GPU 0 of two): mmengine's runner at accel=max without compile.
# In part 11 its own compile (the whole train_step, graph breaks at every mmcv op, recompiles on the
# voxel counts) was still compiling when the 180 s cap stopped it; this is its best working setting.
export LIMIT=${LIMIT:-170}; source scripts/device/lib.sh || exit 1
export DRIVEBENCH_EXIT_TIMEOUT_S=20 CUDA_VISIBLE_DEVICES=0
source scripts/device/openmmlab_stack.sh
mkdir -p "$RUNS/mm"
M="model=mmdet3d bench.steps=30 bench.warmup_steps=5 bench.ceiling=false bench.val_batches=0 ckpt=none"
run mm/7_train_max_nocompile 80 $M accel=max accel.compile=false
run mm/8_train_max 75 $M accel=max
bundle
log "done in $(( $(date +%s) - START ))s"
