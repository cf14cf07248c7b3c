#!/usr/bin/env bash
# GPU benchmark, part 37 (issue 20, one H200): what b36 left. One part per device call:
#   LIMIT=580 bash scripts/device/bench37.sh a > /dev/null 2>&1; tail -c 9000 $OUT/log.txt
#   a  QCNet accel=auto accel.auto_numerics=true then accel=max, training-only, on one Inductor cache (empty before
#      the first): auto against max in one call, and the trial's cost with the fused optimizer switched on the
#      run's own steps (b36: 26.4 s of which 13.9 s short fits of base and fused AdamW)
#   b  right after a on the same machine: QCNet convergence max seed 2024 warm, then max with TF32 off seed 2023
#      (TF32 is in Inductor's cache key: compiles cold). Which knob moves max's final minFDE ~3% above none's:
#      bf16 did not (b31)
#   c  MapTR auto then max, training-only (b35 a2: 0.99x on a machine where compile paid for neither)
export LIMIT=${LIMIT:-580}; source scripts/device/lib.sh || exit 1
one_gpu_part "$1"
C=$QCNET_CONV QM=$QCNET_METRICS T=$TRAIN_ONLY
case "$PART" in
  a) cold qcnet; run qcnet_auto 330 model=qcnet $T accel=auto accel.auto_numerics=true; trials qcnet_auto; facts qcnet_auto
     run qcnet_max 200 model=qcnet $T accel=max; facts qcnet_max ;;
  b) export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-qcnet
     [[ -d $TORCHINDUCTOR_CACHE_DIR ]] || log "NOTE: no Inductor cache from part a on this machine: the next run compiles cold"
     run qcnet_conv_max_s2024_warm 200 $C accel=max seed=2024; curve qcnet_conv_max_s2024_warm $QM; facts qcnet_conv_max_s2024_warm
     run qcnet_conv_max_notf32_s2023 360 $C accel=max accel.tf32=false seed=2023; curve qcnet_conv_max_notf32_s2023 $QM; facts qcnet_conv_max_notf32_s2023 ;;
  c) cold maptr; run maptr_auto 250 model=maptr $T accel=auto accel.auto_numerics=true; trials maptr_auto
     run maptr_max 200 model=maptr $T accel=max ;;
  *) log "unknown part $PART (a, b, c)"; exit 2 ;;
esac
report
log "part $PART done in $(( $(date +%s) - START ))s"
