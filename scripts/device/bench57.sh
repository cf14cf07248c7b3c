#!/usr/bin/env bash
# GPU benchmark, part 57 (written 2026-12-07, twenty-seventh session; not run yet), issue 20: can `max` step faster
# for GaussianFormer and SparseDrive? b56 put GaussianFormer's `max` at 2.95-2.99x `none` a step on an H100 (3.04x
# between validations) and SparseDrive's is 2.87x epoch for epoch (b48): at such paces no schedule shows 3x sooner
# once `max`'s start is paid. Two model knobs that could cut `max`'s GPU time were never timed in a whole step: the
# deformable aggregation compiled (`model.net.aggregation=compiled`: 2.6x faster than grid_sample for GaussianFormer
# and 1.5x for SparseDrive as ops alone on the H200, b21) and GaussianFormer's encoder compiled
# (`model.net.compile_scope=encoder`: the anchor encoder and each block's aggregation, FFN and refinement).
#   bash scripts/device/bench57.sh g > /dev/null 2>&1; tr '\r' '\n' < $OUT/log.txt | grep -v "train step:\|it/s\]" | tail -c 9000
# (run tool timeout 595; no QCNet: set av2's wheel aside)
#   g  GaussianFormer `max`, training only, STEPS (default 80) steps each on one cache that starts empty: as
#      configured, aggregation compiled, encoder compiled, both (~560 s on an H100)
#   s  SparseDrive `max`, training only, STEPS (default 100): as configured, aggregation compiled, as configured again
#      (its own run-to-run spread)
#   gc GaussianFormer convergence `max` with KNOBS (the overrides g found faster), seeds SEEDS (default "2023 2024"),
#      the first on an emptied cache: against b56's `none` seed 2023 on an H100 (CAP per seed, default 250)
export LIMIT=${LIMIT:-565}; source scripts/device/lib.sh || exit 1
one_gpu_part "$1"
GF="model=gaussianformer $TRAIN_ONLY accel=max bench.steps=${STEPS:-80}"
SD="model=sparsedrive $TRAIN_ONLY accel=max bench.steps=${STEPS:-100}"
AGG=model.net.aggregation=compiled ENC=model.net.compile_scope=encoder
case "$PART" in
  g) cold gf57
     run gf_max 190 $GF; run gf_max_agg 130 $GF $AGG; run gf_max_enc 150 $GF $ENC; run gf_max_agg_enc 110 $GF $AGG $ENC ;;
  s) cold sd57
     run sd_max 160 $SD; run sd_max_agg 150 $SD $AGG; run sd_max2 120 $SD ;;
  gc) RECIPE="model.optimizer.lr=1e-3 ${KNOBS:-}" CAP=${CAP:-250} conv_max gaussianformer val/miou_present val/miou ;;
  *) log "unknown part $PART (g, s, gc)"; exit 2 ;;
esac
report
log "part $PART done in $(( $(date +%s) - START ))s"
