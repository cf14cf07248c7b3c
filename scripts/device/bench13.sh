#!/usr/bin/env bash
# GPU benchmark, part 13 (not yet run; one H200): QCNet with model.net.compile_scope=layers (each
# attention / Fourier layer compiled with dynamic shapes, against the launch-bound eager step), and
# the loader table's last single-knob row (pin_memory alone, issue 3).
export LIMIT=${LIMIT:-565}; source scripts/device/lib.sh || exit 1
export DRIVEBENCH_EXIT_TIMEOUT_S=20 CUDA_VISIBLE_DEVICES=0
Q="model=qcnet accel=max bench.steps=60 bench.val_batches=0 bench.ceiling=false ckpt=none"
run qcnet_layers 300 $Q model.net.compile_scope=layers
run qcnet_layers_b32 180 $Q model.net.compile_scope=layers model.batch_size=32 bench.steps=30
run loader_pin_memory 60 bench=loader model=maptr accel=none accel.pin_memory=true bench.loader_batches=10
log "done in $(( $(date +%s) - START ))s"
