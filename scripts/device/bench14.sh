#!/usr/bin/env bash
# GPU benchmark, part 14 (not yet run; one H200): GaussianFormer gs25600 at accel=max with the default
# compile scope (image encoder) and with model.net.compile_scope=encoder (also the anchor encoder and
# each block's aggregation, FFN and refinement), interleaved; against the 3x-of-none target, which the
# default reached 2.75x of (max 2.57 vs none 0.934 samples/s, part 3).
export LIMIT=${LIMIT:-565}; source scripts/device/lib.sh || exit 1
export DRIVEBENCH_EXIT_TIMEOUT_S=20 CUDA_VISIBLE_DEVICES=0
G="model=gaussianformer accel=max bench.steps=50 bench.val_batches=0 bench.ceiling_steps=15 bench.ceiling_warmup_steps=5 ckpt=none"
run gaussianformer_max 150 $G
run gaussianformer_encoder 220 $G model.net.compile_scope=encoder
run gaussianformer_max_b 150 $G
log "done in $(( $(date +%s) - START ))s"
