#!/usr/bin/env bash
# GPU benchmark, part 28 (one H200): issue 18, the README's main command with QCNet's new default
# (compile_scope=layers, eager validation), as written: 300 steps + validation + ceiling.
#   bash scripts/device/bench28.sh > /dev/null 2>&1; tail -c 6000 $OUT/log.txt     (~7 min)
export LIMIT=${LIMIT:-500}; source scripts/device/lib.sh || exit 1
export DRIVEBENCH_EXIT_TIMEOUT_S=20 CUDA_VISIBLE_DEVICES=0
run q_readme 460 model=qcnet accel=max ckpt=none; facts q_readme
grep -E "^(bottleneck|verdict|efficiency|ceiling|GPU)" "$RUNS/q_readme.log" | tee -a "$OUT/log.txt"
log "done in $(( $(date +%s) - START ))s"
