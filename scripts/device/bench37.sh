#!/usr/bin/env bash
# GPU benchmark, part 37 (issue 20, one H200): what b36 left. Run at 2b0b333, when training's shape buckets were
# kept next to the compile cache (a BucketFile, removed after these calls: it changed no compile figure; see
# experiments/results/h200-2026-12-04-b37). One part per device call:
#   LIMIT=580 bash scripts/device/bench37.sh a > /dev/null 2>&1; tail -c 9000 $OUT/log.txt
#   a  the GPU tests of tests/test_qcnet_static_shapes.py, then QCNet accel=auto accel.auto_numerics=true then accel=max, training-only, on one Inductor cache (empty before
#      the first): auto against max in one call, the trial's cost with the fused optimizer switched on the run's
#      own steps (b36: 26.4 s of which 13.9 s short fits of base and fused AdamW)
#   b  right after a on the same machine (its cache): QCNet convergence accel=max seeds 2024, 2023,
#      2025, all warm. b36: the warm first step took 38-48 s with 6 FX-graph misses for shapes of the seed's own
#   c  MapTR auto then max, training-only (b35 a2: 0.99x on a machine where compile paid for neither)
#   d  (if time is left) QCNet convergence max with TF32 off, seed 2023: compiles cold (TF32 is in Inductor's key)
export LIMIT=${LIMIT:-580}; source scripts/device/lib.sh || exit 1
one_gpu_part "$1"
C=$QCNET_CONV QM=$QCNET_METRICS T=$TRAIN_ONLY
warm_qcnet() {
  export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-qcnet
  [[ -d $TORCHINDUCTOR_CACHE_DIR ]] || log "NOTE: no Inductor cache from part a on this machine: the next run compiles cold"
  ls "$TORCHINDUCTOR_CACHE_DIR"/drivebench-shapes 2>/dev/null | tee -a "$OUT/log.txt"
}
case "$PART" in
  a) log "=== gpu tests (released graphs give their memory back; graphed loss and validation)"
     timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_qcnet_static_shapes.py -m gpu > "$RUNS/gpu_tests.log" 2>&1
     rc=$?; tail -15 "$RUNS/gpu_tests.log" | tee -a "$OUT/log.txt"; bundle
     if (( rc != 0 )); then log "gpu tests failed (rc=$rc): stopping"; exit 1; fi
     cold qcnet; run qcnet_auto 330 model=qcnet $T accel=auto accel.auto_numerics=true; trials qcnet_auto; facts qcnet_auto
     run qcnet_max 200 model=qcnet $T accel=max; facts qcnet_max ;;
  b) warm_qcnet
     for seed in 2024 2023 2025; do
       run qcnet_conv_max_s${seed}_warm 175 $C accel=max seed=$seed; curve qcnet_conv_max_s${seed}_warm $QM
       facts qcnet_conv_max_s${seed}_warm
     done ;;
  c) cold maptr; run maptr_auto 250 model=maptr $T accel=auto accel.auto_numerics=true; trials maptr_auto
     run maptr_max 200 model=maptr $T accel=max ;;
  d) warm_qcnet
     run qcnet_conv_max_notf32_s2023 360 $C accel=max accel.tf32=false seed=2023; curve qcnet_conv_max_notf32_s2023 $QM
     facts qcnet_conv_max_notf32_s2023 ;;
  *) log "unknown part $PART (a, b, c, d)"; exit 2 ;;
esac
report
log "part $PART done in $(( $(date +%s) - START ))s"
