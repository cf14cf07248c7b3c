#!/usr/bin/env bash
# GPU benchmark, part 11 (one H200, or GPU 0 of two): the OpenMMLab runner comparison of
# issue 11 on the H200. mmcv 2.1.0 with CUDA ops is built from the sdist in .whl/mm
# (scripts/device/openmmlab_wheels.sh; 175 s on 32 cores in part 10) unless a wheel built here before
# was put back into .whl/mm (the build is copied to $OUT for that). Then PointPillars at its config
# size on the embedded nuScenes set: mmengine's runner vs drivebench, accel=none and max, 30 steps each.
export LIMIT=${LIMIT:-570}; source scripts/device/lib.sh || exit 1
export DRIVEBENCH_EXIT_TIMEOUT_S=20 CUDA_VISIBLE_DEVICES=0
source scripts/device/openmmlab_stack.sh
# one command per job (a failing job must not take the others with it, as a multirun does)
mkdir -p "$RUNS/mm"
M="model=mmdet3d bench.steps=30 bench.warmup_steps=5 bench.ceiling=false bench.val_batches=0 ckpt=none"
run mm/0_mmengine_none 150 $M accel=none bench=mmengine  # the first also writes the mmdet3d infos
run mm/1_train_none 120 $M accel=none
run mm/2_train_max 180 $M accel=max
run mm/3_mmengine_max 180 $M accel=max bench=mmengine
run mm/4_train_none 90 $M accel=none  # repeats in the other order, as time allows
run mm/5_mmengine_none 90 $M accel=none bench=mmengine
timeout 20 python3 -m drivebench.openmmlab.compare "$RUNS/mm" >> "$OUT/log.txt" 2>&1
bundle
log "done in $(( $(date +%s) - START ))s"
