#!/usr/bin/env bash
# GPU benchmark, part 33 (issue 20, one H200): QCNet's convergence at max, cold and warm compile cache.
#   LIMIT=560 bash scripts/device/bench33.sh a > /dev/null 2>&1; tail -c 9000 $OUT/log.txt
#   a  +experiment=convergence accel=max seed=2025 alone on an empty Inductor cache (b31's third max seed
#      ran out of memory beside two other runs), then seed=2023 on the cache it left (the warm start; b29
#      had seed 2023 cold and 2024 warm): time to target cold and warm, and from summary.json's
#      compile_report where the first capture's time goes (compile_s, FX-graph / AOTAutograd cache hits)
#   b  right after a on the same machine: seed=2025 on a's cache (a warm third seed), then
#      accel=max accel.tf32=false seed=2023 (which knob moves max's final minFDE: bf16 did not, b31;
#      TF32 is in Inductor's cache key, so this compiles cold)
#   c  on a fresh machine: seed=2024 cold, then seed=2025 on its cache (with a: three seeds cold and warm)
export LIMIT=${LIMIT:-560}; source scripts/device/lib.sh || exit 1
one_gpu_part "$1"
C=$QCNET_CONV QM=$QCNET_METRICS
case "$PART" in
  a) cold qcnet; run qcnet_conv_max_s2025_cold 360 $C accel=max seed=2025; curve qcnet_conv_max_s2025_cold $QM; facts qcnet_conv_max_s2025_cold
     run qcnet_conv_max_s2023_warm 200 $C accel=max seed=2023; curve qcnet_conv_max_s2023_warm $QM; facts qcnet_conv_max_s2023_warm ;;
  b) export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-qcnet  # part a's cache when the machine is the same (warm)
     run qcnet_conv_max_s2025_warm 200 $C accel=max seed=2025; curve qcnet_conv_max_s2025_warm $QM; facts qcnet_conv_max_s2025_warm
     run qcnet_conv_max_notf32_s2023 400 $C accel=max accel.tf32=false seed=2023; curve qcnet_conv_max_notf32_s2023 $QM; facts qcnet_conv_max_notf32_s2023 ;;
  c) cold qcnet; run qcnet_conv_max_s2024_cold 360 $C accel=max seed=2024; curve qcnet_conv_max_s2024_cold $QM; facts qcnet_conv_max_s2024_cold
     run qcnet_conv_max_s2025_warm 200 $C accel=max seed=2025; curve qcnet_conv_max_s2025_warm $QM; facts qcnet_conv_max_s2025_warm ;;
  *) log "unknown part $PART (a, b, c)"; exit 2 ;;
esac
report
log "part $PART done in $(( $(date +%s) - START ))s"
