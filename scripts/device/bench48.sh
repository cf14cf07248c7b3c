#!/usr/bin/env bash
# GPU benchmark, part 48 (2026-12-06, issue 20): MapTR nano's time to quality again on the fixed device decode
# (74a6db7: every camera-model `max` run before it decoded under torchvision's nvJPEG hazard, b47), with a `none`
# seed on the same machine, so the ratio compares one machine. One part per device call:
#   LIMIT=580 bash scripts/device/bench48.sh a > /dev/null 2>&1; tail -c 9000 $OUT/log.txt
#   a  the device decode's GPU checks (the hazard counted with torchvision alone and through drivebench; the GPU tests
#      of the decode and of the nuScenes transforms), then MapTR nano convergence `max`, seeds 2023 (cold Inductor
#      cache), 2024 and 2025 (warm), then `none` seed 2024 checkpointed each epoch until the call's cap
#   b  the `none` run of a continued on the machine kept warm (resume=auto; the report joins both processes)
#   c  (not run yet) where QCNet's warm `max` start goes, for the 3x that its one-time start keeps from it: a bounded
#      training-only run fills an empty Inductor cache, then two bounded runs start warm on it (the second as dynamo's
#      recorded dynamic dimensions leave it, b33/b37: runs 2-3 still missed 6 graphs); each prints its graph captures'
#      seconds (the first holds the compile) and `compile_s.phases` (dynamo tracing, guards, backend, cache loads),
#      which say what a cut would have to remove (LIMIT=560: ~240 s cold fill on an H200, b37, then ~2 x 120 s)
export LIMIT=${LIMIT:-580}; source scripts/device/lib.sh || exit 1
one_gpu_part "$1"
none_s2024() { resumable maptr_nano_conv_none_s2024_b48 48 val/mAP $NANO accel=none seed=2024 ckpt=local; }
case "$PART" in
  a) python3 tests/test_device_decode_gpu.py 2>&1 | tail -4 | tee -a "$OUT/log.txt"
     python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_device_decode_gpu.py tests/test_transforms_nuscenes.py 2>&1 \
       | grep -E "passed|failed|Error|assert" | tail -12 | tee -a "$OUT/log.txt"
     cold maptr-nano
     for s in 2023 2024 2025; do run maptr_nano_conv_max_s${s}_b48 200 $NANO accel=max seed=$s; curve maptr_nano_conv_max_s${s}_b48 val/mAP; done
     none_s2024 ;;
  b) none_s2024 ;;
  c) cold qcnet-start; run qcnet_fill 240 model=qcnet $TRAIN_ONLY accel=max bench.steps=30; facts qcnet_fill
     for n in 1 2; do run qcnet_warm$n 150 model=qcnet $TRAIN_ONLY accel=max bench.steps=60; facts qcnet_warm$n; done ;;
  *) log "unknown part $PART (a-c)"; exit 2 ;;
esac
report
log "part $PART done in $(( $(date +%s) - START ))s"
