#!/usr/bin/env bash
# GPU benchmark, part 21 (one H200): bench17 again after its first attempt (2026-12-02) failed on two
# counts: accel=max crashed at GaussianFormer's first clipped step (fused AdamW + gradient clipping under
# bf16-mixed, which Lightning refuses; now settled: auto turns the fused kernel off there), and the
# per-run caps were too small for the nuScenes bench generation (64 s) and SparseDrive's compile.
# (1) GaussianFormer gs25600 batch 1: none (upstream's with_cp on) vs max (auto: off), the 3x target;
# (2) SparseDrive small batch 6: max (checkpointing auto) and none (upstream's on).
export LIMIT=${LIMIT:-585}; source scripts/device/lib.sh || exit 1
export DRIVEBENCH_EXIT_TIMEOUT_S=20 CUDA_VISIBLE_DEVICES=0
source scripts/device/bench17_lib.sh
G="model=gaussianformer model.size=gs25600 $STEPS"
S="model=sparsedrive model.size=small $STEPS"
runs gf_b1_none 150 $G accel=none
runs gf_b1_max 150 $G accel=max
runs sd_max_auto 150 $S accel=max
runs sd_none_cp 115 $S accel=none
log "done in $(( $(date +%s) - START ))s"
