#!/usr/bin/env bash
# GPU benchmark, part 48 (2026-12-06, issue 20): MapTR nano's time to quality again on the fixed device decode
# (74a6db7: every camera-model `max` run before it decoded under torchvision's nvJPEG hazard, b47), with a `none`
# seed on the same machine, so the ratio compares one machine. One part per device call:
#   LIMIT=580 bash scripts/device/bench48.sh a > /dev/null 2>&1; tail -c 9000 $OUT/log.txt
#   a  the device decode's GPU checks (the hazard counted with torchvision alone and through drivebench; the GPU tests
#      of the decode and of the nuScenes transforms), then MapTR nano convergence `max`, seeds 2023 (cold Inductor
#      cache), 2024 and 2025 (warm), then `none` seed 2024 checkpointed each epoch until the call's cap
#   b  the `none` run of a continued on the machine kept warm (resume=auto; the report joins both processes)
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
  *) log "unknown part $PART (a, b)"; exit 2 ;;
esac
report
log "part $PART done in $(( $(date +%s) - START ))s"
