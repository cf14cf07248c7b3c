#!/usr/bin/env bash
# GPU benchmark, part 17b (not yet run; one H200): issue 19, part b. (1) op_bench --time: the sparse conv
# (rulebook vs dense), the splatting (radius vs max window) and the deformable aggregation (grid_sample
# vs chunked vs compiled) alone, forward + backward, with peak memory; (2) GaussianFormer gs25600 at
# batch 2 and 4 (upstream cannot run batch > 1), accel=max (checkpointing auto: off) and accel=none
# (upstream's on); (3) the step as it was before issue 19 (model.net.sparse_conv=dense
# model.net.splat_window=max) at max, batch 1, next to bench17's gf_b1_max.
export LIMIT=${LIMIT:-480}; source scripts/device/lib.sh || exit 1
export DRIVEBENCH_EXIT_TIMEOUT_S=20 CUDA_VISIBLE_DEVICES=0
source scripts/device/bench17_lib.sh
log "=== op_bench ($(left)s left)"
timeout 100 python3 -m drivebench.models.op_bench --time --repeats 10 --warmup 3 2>&1 | tee -a "$OUT/log.txt"
G="model=gaussianformer model.size=gs25600 $STEPS"
runs gf_b2_max 100 $G accel=max model.batch_size=2
runs gf_b4_max 110 $G accel=max model.batch_size=4
runs gf_b1_max_pre19 70 $G accel=max model.net.sparse_conv=dense model.net.splat_window=max
runs gf_b2_none 70 $G accel=none model.batch_size=2
runs gf_b4_none 100 $G accel=none model.batch_size=4
log "done in $(( $(date +%s) - START ))s"
