#!/usr/bin/env bash
# GPU benchmark, part 18 (issue 18, one H200): QCNet paper size, batch 4, embedded bench set.
# CUDA graphs (accel=max: cuda_graphs auto -> on) against the eager max step and accel=none, the
# first epoch's losses of max and none for the bf16-tolerance comparison; then per-layer compile +
# graphs. (Part 18 first ran with the whole net compiled + graphs: still compiling after 240 s.)
export LIMIT=${LIMIT:-575}; source scripts/device/lib.sh || exit 1
export DRIVEBENCH_EXIT_TIMEOUT_S=20 CUDA_VISIBLE_DEVICES=0
log "=== GPU tests (graphed loss = eager loss and gradients)"
timeout 150 python3 -m pytest -q -x -p no:cacheprovider -m gpu --tb=short tests/test_qcnet_static_shapes.py > "$OUT/gputest.txt" 2>&1
tail -3 "$OUT/gputest.txt" | tee -a "$OUT/log.txt"
Q="model=qcnet bench.val_batches=0 bench.ceiling=false ckpt=none"
run qcnet_max_graphs 200 $Q accel=max bench.steps=250
run qcnet_none 150 $Q accel=none bench.steps=250
run qcnet_max_eager 70 $Q accel=max accel.cuda_graphs=off bench.steps=60
run qcnet_max_graphs_layers 200 $Q accel=max model.net.compile_scope=layers bench.steps=100
log "done in $(( $(date +%s) - START ))s"
