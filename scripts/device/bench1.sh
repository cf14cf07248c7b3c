#!/usr/bin/env bash
# GPU benchmark, part 1 (2-GPU machine; single-GPU runs pinned to GPU 0): QCNet (issue 2),
# MapTR (issue 4), QCNet DDP scaling and P2P (issue 7). Results: $OUT/log.txt, $OUT/runs.tgz.
export LIMIT=${LIMIT:-540}; source scripts/device/lib.sh || exit 1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee -a "$OUT/log.txt"
nvidia-smi topo -m >> "$OUT/log.txt" 2>&1
COMMON="bench.val_batches=10 bench.ceiling_steps=30 bench.ceiling_warmup_steps=5"
export CUDA_VISIBLE_DEVICES=0
run qcnet_tiny_sanity 90 model=qcnet model.size=tiny data.size=mini accel=max trainer.max_steps=20 bench.warmup_steps=5 bench.val_batches=2 bench.ceiling_steps=10 ckpt=none
run qcnet_max 150 model=qcnet accel=max bench.steps=200 $COMMON ckpt=none
run qcnet_none 150 model=qcnet accel=none bench.steps=100 $COMMON ckpt=none
run maptr_max 170 model=maptr accel=max bench.steps=100 bench.val_batches=5 bench.ceiling_steps=30 bench.ceiling_warmup_steps=5 ckpt=none
run maptr_none 120 model=maptr accel=none bench.steps=40 bench.val_batches=5 bench.ceiling_steps=20 bench.ceiling_warmup_steps=5 ckpt=none
unset CUDA_VISIBLE_DEVICES
run qcnet_max_ddp2_p2p_on 90 model=qcnet accel=max dist=ddp dist.devices=2 dist.p2p=on bench.steps=150 bench.val_batches=0 bench.ceiling=false ckpt=none
run qcnet_max_ddp2_p2p_off 90 model=qcnet accel=max dist=ddp dist.devices=2 dist.p2p=off bench.steps=150 bench.val_batches=0 bench.ceiling=false ckpt=none
log "done in $(( $(date +%s) - START ))s"
