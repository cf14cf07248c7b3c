#!/usr/bin/env bash
# GPU benchmark, part 38 (issue 20, one H200): accel=auto against max for the models b37 left, and the TF32
# ablation of QCNet's final metric. One part per device call:
#   LIMIT=580 bash scripts/device/bench38.sh a > /dev/null 2>&1; tail -c 9000 $OUT/log.txt
#   a  MapTR auto then max, training-only, one Inductor cache (empty before the first) (b35: 0.99x, trial 7.3%)
#   b  SparseDrive auto then max, training-only, bench.steps=150 (its steps take ~0.74 s: a default 300-step run
#      does not fit beside its trial); the trial's share is then of this shorter run
#   c  GaussianFormer, as b
#   d  QCNet convergence max seed 2023 with TF32 off, then on, both on empty caches (TF32 is in Inductor's key):
#      does TF32 move max's final minFDE (b33: ~3% above none; b37: 1.4% over four seeds)?
export LIMIT=${LIMIT:-580}; source scripts/device/lib.sh || exit 1
one_gpu_part "$1"
C=$QCNET_CONV QM=$QCNET_METRICS T=$TRAIN_ONLY
case "$PART" in
  a) auto_then_max maptr model=maptr ;;
  b) auto_then_max sparsedrive model=sparsedrive bench.steps=150 ;;
  c) auto_then_max gaussianformer model=gaussianformer bench.steps=150 ;;
  d) cold qcnet-notf32; run qcnet_conv_max_notf32_s2023 285 $C accel=max accel.tf32=false seed=2023
     curve qcnet_conv_max_notf32_s2023 $QM; facts qcnet_conv_max_notf32_s2023
     cold qcnet-tf32; run qcnet_conv_max_s2023_cold 285 $C accel=max seed=2023
     curve qcnet_conv_max_s2023_cold $QM; facts qcnet_conv_max_s2023_cold ;;
  *) log "unknown part $PART (a, b, c, d)"; exit 2 ;;
esac
report
log "part $PART done in $(( $(date +%s) - START ))s"
