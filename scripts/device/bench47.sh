#!/usr/bin/env bash
# GPU check, part 47 (2026-12-06, issue 20): GaussianFormer's convergence run at accel=max stopped with a CUDA
# device-side assert (nll_loss2d: target out of range) in its first validation (b47 call j, H100). Which op, and is
# it max's? One epoch of 12 training steps then the whole val split, as the convergence experiment validates:
#   a  max with CUDA_LAUNCH_BLOCKING=1 (the traceback names the op), none, then max again without it (a race?)
#   b  after the fix (torchvision's decode given outputs of a stream of its own): the hazard counted with torchvision
#      alone and through drivebench's decode, the GPU tests of the decode, then max again without CUDA_LAUNCH_BLOCKING
#   LIMIT=450 bash scripts/device/bench47.sh a > /dev/null 2>&1; tail -c 9000 $OUT/log.txt
export LIMIT=${LIMIT:-450}; source scripts/device/lib.sh || exit 1
one_gpu_part "$1"
SHORT="+experiment=convergence model=gaussianformer model.optimizer.lr=1e-3 seed=2023 model.convergence.max_epochs=1 +trainer.limit_train_batches=12"
where() {  # the first traceback's drivebench frames and its error line
  grep -v "Assertion" "$RUNS/$1/__main__.log" 2>/dev/null | grep -E "File \"/.*drivebench|Error" | head -14 | tee -a "$OUT/log.txt"
  grep -c "Assertion" "$RUNS/$1.log" | sed 's/^/  assertion lines: /' | tee -a "$OUT/log.txt"
  grep -m2 "Assertion" "$RUNS/$1.log" | cut -c1-200 | tee -a "$OUT/log.txt"
}
case "$PART" in
  a) cold gf-diag
     CUDA_LAUNCH_BLOCKING=1 run gf_max_blocking 200 $SHORT accel=max; where gf_max_blocking; curve gf_max_blocking val/miou_present
     run gf_none 120 $SHORT accel=none; where gf_none; curve gf_none val/miou_present
     run gf_max 120 $SHORT accel=max; where gf_max; curve gf_max val/miou_present ;;
  b) python3 tests/test_device_decode_gpu.py 2>&1 | tail -3 | tee -a "$OUT/log.txt"
     python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_device_decode_gpu.py 2>&1 | tail -3 | tee -a "$OUT/log.txt"
     cold gf-diag; run gf_max_fixed 230 $SHORT accel=max; where gf_max_fixed; curve gf_max_fixed val/miou_present ;;
  *) log "unknown part $PART (a, b)"; exit 2 ;;
esac
log "part $PART done in $(( $(date +%s) - START ))s"
