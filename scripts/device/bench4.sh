#!/usr/bin/env bash
# GPU benchmark, part 4 (2-GPU host; single-GPU runs pinned to GPU 0): the device-prefetch GPU test
# and MapTR accel=max with it (issue 4); checkpoint cost none/local/async (issue 8); QCNet 2 GPUs
# with P2P off and MapTR on 2 GPUs (issue 7); the doctor on one GPU (issue 10).
export LIMIT=${LIMIT:-555}; source scripts/device/lib.sh || exit 1
export CUDA_VISIBLE_DEVICES=0
log "=== pytest tests/test_device_prefetch.py (GPU test included)"
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_device_prefetch.py > "$RUNS/pytest_prefetch.log" 2>&1
rc=$?; tail -3 "$RUNS/pytest_prefetch.log" | tee -a "$OUT/log.txt"
if (( rc == 0 )); then
  run maptr_max_prefetch 100 model=maptr accel=max bench.steps=100 bench.val_batches=0 bench.ceiling_steps=30 bench.ceiling_warmup_steps=5 ckpt=none
else
  log "device prefetch test failed: MapTR prefetch run skipped"
fi
Q="model=qcnet accel=max bench.steps=60 bench.warmup_steps=10 bench.val_batches=0 bench.ceiling=false"
run qcnet_ckpt_none 75 $Q ckpt=none
run qcnet_ckpt_local 75 $Q ckpt=local ckpt.every_n_steps=15 ckpt.keep_last_k=2
run qcnet_ckpt_async 75 $Q ckpt=async ckpt.every_n_steps=15 ckpt.keep_last_k=2
unset CUDA_VISIBLE_DEVICES
run qcnet_ddp2_p2p_off 100 model=qcnet accel=max dist=ddp dist.devices=2 dist.p2p=off bench.steps=100 bench.val_batches=0 bench.ceiling=false ckpt=none
run maptr_ddp2 110 model=maptr accel=max dist=ddp dist.devices=2 bench.steps=60 bench.val_batches=0 bench.ceiling=false ckpt=none
if (( $(left) > 40 )); then
  log "=== doctor (1 GPU)"
  CUDA_VISIBLE_DEVICES=0 timeout -k 5 $(( $(left) - 8 )) python3 -m drivebench.doctor model=qcnet --json "$RUNS/doctor_1gpu.json" > "$RUNS/doctor_1gpu.txt" 2>&1
  log "rc=$?"; cat "$RUNS/doctor_1gpu.txt" >> "$OUT/log.txt"
fi
cp "$RUNS"/pytest_prefetch.log "$OUT/" 2>/dev/null; bundle
log "done in $(( $(date +%s) - START ))s"
