#!/usr/bin/env bash
# GPU benchmark, part 49 (2026-12-06, issue 20): MapTR nano's time to quality on the H200 with the fixed device
# decode (b48 made it on an H100: 3.71x; on the H200 only runs before the fix exist), after GPU checks of the
# graphed step that QCNet's `max` trains with: QCNet's `max` runs lag `none` by ~0.2-0.3 m of val minFDE at every
# epoch (14 runs against 6, one fp32 `max` among them), so the checks ask whether a replayed step draws new dropout
# masks (eager and compiled layers) and whether graphed optimizer steps move the weights as eager ones do.
#   LIMIT=560 bash scripts/device/bench49.sh a > /dev/null 2>&1; tail -c 9000 $OUT/log.txt
#   a  the graphed-step GPU tests (tests/test_qcnet_static_shapes.py -m gpu), then MapTR nano convergence `max`,
#      seeds 2023 (cold Inductor cache), 2024, 2025 (warm), then `none` seed 2024 checkpointed each epoch to the cap
#   b  the `none` run of a continued on the machine kept warm (resume=auto; the report joins both processes)
#   c  QCNet paper, 3 epochs at accel=none, then the same weights validated at fp32 / bf16, TF32 off / on
#      (scripts/device/eval_precision.py, ~200 s on an H200): is the lag of `max`'s val minFDE the validation's rounding?
#   bc b, then c, in one call
#   d  MapTR nano `max` seeds 2023 (cold), 2024, 2025 alone (~230 s): for a machine whose `none` runs on record are
#      of its kind (the H200's b39/b41/b42 `none` runs decoded on the CPU, which the device decode fix did not touch)
export LIMIT=${LIMIT:-560}; source scripts/device/lib.sh || exit 1
one_gpu_part "$1"
none_s2024() { resumable maptr_nano_conv_none_s2024_b49 48 val/mAP $NANO accel=none seed=2024 ckpt=local; }
# max_seeds CAP: MapTR nano convergence max, seeds 2023 (on an emptied Inductor cache), 2024, 2025, each capped at CAP s
max_seeds() {
  cold maptr-nano
  for s in 2023 2024 2025; do run maptr_nano_conv_max_s${s}_b49 "$1" $NANO accel=max seed=$s; curve maptr_nano_conv_max_s${s}_b49 val/mAP; done
}
case "$PART" in
  a) python3 -m pytest -q -m gpu -p no:cacheprovider -rs tests/test_qcnet_static_shapes.py 2>&1 \
       | grep -E "passed|failed|Error|assert|SKIP|>|^E " | tail -30 | tee -a "$OUT/log.txt"
     max_seeds 200
     none_s2024 ;;
  b) none_s2024 ;;
  d) max_seeds 120 ;;
  c|bc) [[ $PART == bc ]] && none_s2024
     log "=== eval_precision (3 epochs, $(left)s left)"
     timeout $(( $(left) - 10 )) python3 scripts/device/eval_precision.py 3 2>&1 | grep "^{" | tee -a "$OUT/log.txt" ;;
  *) log "unknown part $PART (a, b, c, bc, d)"; exit 2 ;;
esac
report
log "part $PART done in $(( $(date +%s) - START ))s"
