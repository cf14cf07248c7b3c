#!/usr/bin/env bash
# GPU check, part 20 (one H200, the session's last ~5 device minutes): (1) every GPU test of the suite
# (graphed loss vs eager with TF32 off, step clock CUDA spans, device prefetch, pinned staging);
# (2) QCNet max with bench.profile=10: the profile's kernels per step and GPU active time beside NVML
# busy and the CUDA-event span, and the bottleneck verdict; (3) the README's main command as written
# (`python -m drivebench model=qcnet accel=max`) for the README's excerpt.
export LIMIT=${LIMIT:-265}; source scripts/device/lib.sh || exit 1
export DRIVEBENCH_EXIT_TIMEOUT_S=20 CUDA_VISIBLE_DEVICES=0
log "=== pytest -m gpu"
timeout 45 python3 -m pytest -q -p no:cacheprovider -m gpu --tb=line tests/test_qcnet_static_shapes.py tests/test_step_timer.py tests/test_device_prefetch.py > "$OUT/pytest_gpu.txt" 2>&1
grep -E "passed|failed|FAILED|Error" "$OUT/pytest_gpu.txt" | tail -8 | tee -a "$OUT/log.txt"
run qcnet_max_profile 105 model=qcnet accel=max bench.profile=10 bench.steps=30 bench.val_batches=0 bench.ceiling=false ckpt=none
grep -E "^(bottleneck|  evidence|  next|profile|  host in aten|  kernels|  GPU|  top)" "$RUNS/qcnet_max_profile.log" | tee -a "$OUT/log.txt"
find "$RUNS" -name '*.pt.trace.json.gz' -size +8M -delete; bundle
run qcnet_readme_command 120 model=qcnet accel=max
tail -32 "$RUNS/qcnet_readme_command.log" > "$OUT/readme_excerpt.txt"
log "done in $(( $(date +%s) - START ))s"
