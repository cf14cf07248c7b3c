#!/usr/bin/env bash
# GPU benchmark, part 27 (one H200): issue 18 after part 26 showed compile_scope=layers at 61 samples/s.
# (1) dynamic shapes from the first compile (accel.compile_dynamic=true: fewer recompiles, less warm-up?),
# 250 steps = the bench set's first epoch, train/loss every 10 steps for the first-epoch loss plot;
# (2) the README's main command with compile_scope=layers (validation + ceiling phases compile too).
#   bash scripts/device/bench27.sh > /dev/null 2>&1; tail -c 9000 $OUT/log.txt     (~9 min)
export LIMIT=${LIMIT:-585}; source scripts/device/lib.sh || exit 1
export DRIVEBENCH_EXIT_TIMEOUT_S=20 CUDA_VISIBLE_DEVICES=0
B="model=qcnet accel=max bench.val_batches=0 bench.ceiling=false ckpt=none"
run q_layers_dyn250 270 $B bench.steps=250 model.net.compile_scope=layers accel.compile_dynamic=true; facts q_layers_dyn250
run q_readme_layers 290 model=qcnet accel=max ckpt=none model.net.compile_scope=layers; facts q_readme_layers
log "done in $(( $(date +%s) - START ))s"
