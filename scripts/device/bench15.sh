#!/usr/bin/env bash
# GPU benchmark, part 15 (not yet run; one H200, or GPU 0 of two): mmcv's hard voxelisation against
# drivebench's sorted one. Part 11 found mmdet3d's data preprocessor (mmcv's deterministic CUDA hard
# voxelisation, which scans every earlier point per point) at 0.164 s of the 0.265 s PointPillars step
# at accel=max, in both runners. (1) the op alone on a 300k-point cloud; (2) drivebench accel=max with
# model.net.voxelizer=mmcv / sorted, interleaved; (3) mmengine's runner at max for reference.
export LIMIT=${LIMIT:-565}; source scripts/device/lib.sh || exit 1
export DRIVEBENCH_EXIT_TIMEOUT_S=20 CUDA_VISIBLE_DEVICES=0
source scripts/device/openmmlab_stack.sh
log "=== voxel_bench ($(left)s left)"
timeout 120 python3 -m drivebench.openmmlab.voxel_bench --points 300000 2>&1 | tee -a "$OUT/log.txt"
timeout 60 python3 -m drivebench.openmmlab.voxel_bench --points 34000 2>&1 | tee -a "$OUT/log.txt"
mkdir -p "$RUNS/mm"
M="model=mmdet3d bench.steps=30 bench.warmup_steps=5 bench.ceiling=false bench.val_batches=0 ckpt=none accel=max"
run mm/0_train_max_mmcv 150 $M  # the first also writes the mmdet3d infos
run mm/1_train_max_sorted 90 $M model.net.voxelizer=sorted
run mm/2_train_max_mmcv 90 $M
run mm/3_train_max_sorted 90 $M model.net.voxelizer=sorted
run mm/4_mmengine_max 90 $M bench=mmengine
bundle
log "done in $(( $(date +%s) - START ))s"
