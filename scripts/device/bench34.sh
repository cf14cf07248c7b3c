#!/usr/bin/env bash
# GPU benchmark, part 34 (issue 20, one H200): what b33 left. One part per device call:
#   LIMIT=560 bash scripts/device/bench34.sh a > /dev/null 2>&1; tail -c 9000 $OUT/log.txt
#   a  QCNet +experiment=convergence accel=max accel.compile_dynamic=true: seed 2024 on an empty compile
#      cache, then seed 2025 on the cache it left (b33 without it: 277 s cold / 128 s warm to target,
#      compiling 165-171 / 36-40 s, 6 graph misses warm). Does dynamic from the first step make the warm
#      start short enough for 3x (114 s), and what does it cost per step? The cache is accel.compile_cache's
#      default (<paths.cache>/inductor, emptied first), so the warm run also shows the knob at work
#   b  QCNet convergence accel=max accel.tf32=false seed=2023 (which knob moves max's final minFDE; bf16
#      did not, b31)
#   c  the compile cache through accel.compile_cache (default auto = <paths.cache>/inductor, no
#      TORCHINDUCTOR_CACHE_DIR exported): QCNet bench=train accel=max twice; the second run's
#      compile_report should show a warm cache
export LIMIT=${LIMIT:-560}; source scripts/device/lib.sh || exit 1
one_gpu_part "$1"
C=$QCNET_CONV QM=$QCNET_METRICS T=$TRAIN_ONLY
case "$PART" in
  a) unset TORCHINDUCTOR_CACHE_DIR; rm -rf "$DRIVEBENCH_CACHE/inductor"  # accel.compile_cache=auto's directory, empty
     run qcnet_conv_maxdyn_s2024_cold 360 $C accel=max accel.compile_dynamic=true seed=2024; curve qcnet_conv_maxdyn_s2024_cold $QM; facts qcnet_conv_maxdyn_s2024_cold
     run qcnet_conv_maxdyn_s2025_warm 200 $C accel=max accel.compile_dynamic=true seed=2025; curve qcnet_conv_maxdyn_s2025_warm $QM; facts qcnet_conv_maxdyn_s2025_warm ;;
  b) run qcnet_conv_max_notf32_s2023 400 $C accel=max accel.tf32=false seed=2023; curve qcnet_conv_max_notf32_s2023 $QM; facts qcnet_conv_max_notf32_s2023 ;;
  c) unset TORCHINDUCTOR_CACHE_DIR; rm -rf "$DRIVEBENCH_CACHE/inductor"  # the knob's directory, emptied first
     run qcnet_max_first 300 model=qcnet $T accel=max; facts qcnet_max_first
     run qcnet_max_second 200 model=qcnet $T accel=max; facts qcnet_max_second ;;
  *) log "unknown part $PART (a, b, c)"; exit 2 ;;
esac
report
log "part $PART done in $(( $(date +%s) - START ))s"
