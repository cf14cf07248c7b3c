#!/usr/bin/env bash
# GPU benchmark, part 18 (issue 18, one H200): QCNet paper size, batch 4, embedded bench set.
# CUDA graphs (accel=max: cuda_graphs auto -> on) against the eager max step and accel=none, each
# first epoch's losses for the bf16-tolerance comparison; then compile of the whole net + graphs.
export LIMIT=${LIMIT:-575}; source scripts/device/lib.sh || exit 1
export DRIVEBENCH_EXIT_TIMEOUT_S=20 CUDA_VISIBLE_DEVICES=0
log "=== GPU tests (graphed loss = eager loss and gradients)"
timeout 150 python3 -m pytest -q -x -p no:cacheprovider -m gpu tests/test_qcnet_static_shapes.py 2>&1 | tail -4 | tee -a "$OUT/log.txt"
Q="model=qcnet bench.val_batches=0 bench.ceiling=false ckpt=none"
run qcnet_max_graphs 240 $Q accel=max bench.steps=250
run qcnet_none 150 $Q accel=none bench.steps=250
run qcnet_max_eager 90 $Q accel=max accel.cuda_graphs=off bench.steps=100
run qcnet_max_graphs_compile 240 $Q accel=max model.net.compile_scope=net bench.steps=100
log "done in $(( $(date +%s) - START ))s"
