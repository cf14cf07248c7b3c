#!/usr/bin/env bash
# GPU benchmark, part 26 (one H200): issue 18, what is left of QCNet's GPU-bound step at accel=max.
# (1) the padding: finer shape buckets (model.module.max_buckets / bucket_growth) pad less and
# capture more graphs; (2) Inductor over each attention / Fourier layer (model.net.compile_scope=layers,
# recompile limit raised), which fuses their elementwise chains, replayed inside the CUDA graphs.
#   bash scripts/device/bench26.sh > /dev/null 2>&1; tail -c 9000 $OUT/log.txt     (~9 min)
export LIMIT=${LIMIT:-585}; source scripts/device/lib.sh || exit 1
export DRIVEBENCH_EXIT_TIMEOUT_S=20 CUDA_VISIBLE_DEVICES=0
B="model=qcnet accel=max bench.steps=150 bench.val_batches=0 bench.ceiling=false ckpt=none"
run q_max 150 $B; facts q_max                                                     # data generation included
run q_max_b8 110 $B model.module.max_buckets=8 model.module.bucket_growth=1.06; facts q_max_b8
run q_max_layers 260 $B model.net.compile_scope=layers; facts q_max_layers
run q_max_again 90 $B; facts q_max_again
log "done in $(( $(date +%s) - START ))s"
