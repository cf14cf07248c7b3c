#!/usr/bin/env bash
# GPU benchmark, part 36 (issue 20, one H200): QCNet's time to quality at max with validation replayed from
# CUDA graphs and the validation workers kept for the fit (b33: ~6 s of each ~20-s max epoch was validation,
# the eager forward launch-bound; warm max 128 s to target against 114 s for 3x). One part per device call:
#   LIMIT=580 bash scripts/device/bench36.sh a > /dev/null 2>&1; tail -c 9000 $OUT/log.txt
#   a  the CUDA-only tests of the graphed validation (stops here if they fail), then
#      +experiment=convergence accel=max seed=2024 on an empty Inductor cache, then seed=2025 on its cache
#   b  right after a (the same machine keeps a's cache; on a fresh one the first run compiles cold and says
#      so): seed=2023 warm (with a: warm seeds 2023 and 2025, cold 2024), then QCNet accel=auto
#      accel.auto_numerics=true and accel=max, training-only (auto within 5% of max under the in-run trial)
export LIMIT=${LIMIT:-580}; source scripts/device/lib.sh || exit 1
one_gpu_part "$1"
C=$QCNET_CONV QM=$QCNET_METRICS T=$TRAIN_ONLY
case "$PART" in
  a) log "=== gpu tests (graphed validation)"
     timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_qcnet_static_shapes.py -m gpu > "$RUNS/gpu_tests.log" 2>&1
     rc=$?; tail -15 "$RUNS/gpu_tests.log" | tee -a "$OUT/log.txt"; bundle
     if (( rc != 0 )); then log "gpu tests failed (rc=$rc): stopping"; exit 1; fi
     cold qcnet; run qcnet_conv_max_s2024_cold 360 $C accel=max seed=2024; curve qcnet_conv_max_s2024_cold $QM; facts qcnet_conv_max_s2024_cold
     run qcnet_conv_max_s2025_warm 200 $C accel=max seed=2025; curve qcnet_conv_max_s2025_warm $QM; facts qcnet_conv_max_s2025_warm ;;
  b) export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-qcnet
     [[ -d $TORCHINDUCTOR_CACHE_DIR ]] || log "NOTE: no Inductor cache from part a on this machine: the next run compiles cold"
     run qcnet_conv_max_s2023_warm 200 $C accel=max seed=2023; curve qcnet_conv_max_s2023_warm $QM; facts qcnet_conv_max_s2023_warm
     run qcnet_auto 200 model=qcnet $T accel=auto accel.auto_numerics=true; trials qcnet_auto; facts qcnet_auto
     run qcnet_max 120 model=qcnet $T accel=max; facts qcnet_max ;;
  *) log "unknown part $PART (a, b)"; exit 2 ;;
esac
report
log "part $PART done in $(( $(date +%s) - START ))s"
