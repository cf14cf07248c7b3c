#!/usr/bin/env bash
# GPU benchmark, part 32 (issue 20, one H200): what b31 left open. One part per device call:
#   LIMIT=560 bash scripts/device/bench32.sh a > /dev/null 2>&1; tail -c 9000 $OUT/log.txt
#   a  MapTR: accel=auto accel.auto_numerics=true (compute knobs now prefer max's value on a tie) and
#      accel=max in one call, both training-only on one Inductor cache: auto within 5% of max? (b31: 0.88x
#      against max of the session before)
#   b  QCNet: accel=max with accel.compile_dynamic=true on an empty cache, training-only: the capture
#      times (b31 auto, dynamic by dynamo's choice: 159.7 s, then 21.1 s for the second bucket) and the
#      step (b31: 59.6 ms); then the same on the cache it left (the warm start)
#   c  QCNet +experiment=convergence accel=max seed=2025 alone (b31's third max seed ran out of memory
#      beside two other runs), then accel=max accel.tf32=false seed=2023 if the time allows (which
#      knob moves max's final minFDE: bf16 did not, b31)
export LIMIT=${LIMIT:-560}; source scripts/device/lib.sh || exit 1
one_gpu_part "$1"
C=$QCNET_CONV QM=$QCNET_METRICS T=$TRAIN_ONLY
case "$PART" in
  a) cold maptr; run maptr_auto 250 model=maptr $T accel=auto accel.auto_numerics=true; trials maptr_auto
     run maptr_max 200 model=maptr $T accel=max ;;
  b) cold qcnet_dyn; run qcnet_max_dyn_cold 300 model=qcnet $T accel=max accel.compile_dynamic=true; facts qcnet_max_dyn_cold
     run qcnet_max_dyn_warm 200 model=qcnet $T accel=max accel.compile_dynamic=true; facts qcnet_max_dyn_warm ;;
  c) run qcnet_conv_max_s2025 400 $C accel=max seed=2025; curve qcnet_conv_max_s2025 $QM
     run qcnet_conv_max_notf32_s2023 400 $C accel=max accel.tf32=false seed=2023; curve qcnet_conv_max_notf32_s2023 $QM ;;
  *) log "unknown part $PART (a, b, c)"; exit 2 ;;
esac
report
log "part $PART done in $(( $(date +%s) - START ))s"
