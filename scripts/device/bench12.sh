#!/usr/bin/env bash
# GPU benchmark, part 12 (not yet run; one H200). (1) QCNet at the paper's *global* batch on one GPU:
# upstream trains 8 GPUs x 4 with lr 5e-4 on the mean loss, i.e. 32 scenes per optimizer step; batch 32
# on one H200 is that same optimization, and a launch-bound step (GPU busy 41% at batch 4) should carry
# 8x the scenes for much less than 8x the time. Batch 4 / 16 / 32 side by side. (2) Async checkpoints
# again now that the pinned staging buffers are reserved after the first optimizer step (part 8: the
# first save blocked 0.36-0.41 s, later ones 0.02-0.03 s), interleaved with runs without checkpoints.
export LIMIT=${LIMIT:-565}; source scripts/device/lib.sh || exit 1
export DRIVEBENCH_EXIT_TIMEOUT_S=20 CUDA_VISIBLE_DEVICES=0
Q="model=qcnet accel=max bench.steps=60 bench.val_batches=0 bench.ceiling=false ckpt=none"
run qcnet_b4 85 $Q
run qcnet_b16 90 $Q model.batch_size=16 bench.steps=40
run qcnet_b32 100 $Q model.batch_size=32 bench.steps=30
C="model=maptr accel=max bench.steps=72 bench.val_batches=0 bench.ceiling=false"
K="ckpt.every_n_steps=18 ckpt.keep_last_k=2"
run maptr_ckpt_none_a 75 $C ckpt=none
run maptr_ckpt_async_a 60 $C ckpt=async $K
run maptr_ckpt_none_b 60 $C ckpt=none
run maptr_ckpt_async_b 60 $C ckpt=async $K
log "done in $(( $(date +%s) - START ))s"
