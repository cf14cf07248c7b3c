#!/usr/bin/env bash
# GPU benchmark, part 24 (one H200; what the 2026-12-02 second session's device time allowed after
# bench19.sh n): the accel=max convergence run of QCNet next to part n's accel=none one, and issue 19's
# GaussianFormer batches and ops alone (bench17b.sh's items, with caps that include data generation).
#   bash scripts/device/bench24.sh x > /dev/null 2>&1; tail -c 8000 $OUT/log.txt
#   x  QCNet convergence accel=max seed 2023 (~280 s), GaussianFormer gs25600 batch 2 accel=max (data
#      generation included, ~200 s), op_bench --time in what is left
#   y  GaussianFormer gs25600 batch 4 accel=max, then MapTR convergence accel=max seed 2023 if time is left
export LIMIT=${LIMIT:-585}; source scripts/device/lib.sh || exit 1
source scripts/device/bench17_lib.sh
export DRIVEBENCH_EXIT_TIMEOUT_S=20 CUDA_VISIBLE_DEVICES=0 KILL_GRACE=20
C="+experiment=convergence"
G="model=gaussianformer model.size=gs25600 $STEPS"
case "${1:-x}" in
  x) run qcnet_conv_max_s2023 290 $C model=qcnet accel=max seed=2023
     runs gf_b2_max 200 $G accel=max model.batch_size=2
     if (( $(left) > 40 )); then
       log "=== op_bench ($(left)s left)"
       timeout $(( $(left) - 10 )) python3 -m drivebench.models.op_bench --time --repeats 10 --warmup 3 2>&1 | tee -a "$OUT/log.txt"
     fi ;;
  y) runs gf_b4_max 200 $G accel=max model.batch_size=4
     run maptr_conv_max_s2023 250 $C model=maptr accel=max seed=2023 ;;
  *) log "unknown part $1 (x, y)"; exit 2 ;;
esac
bundle
log "part $1 done in $(( $(date +%s) - START ))s"
