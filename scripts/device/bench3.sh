#!/usr/bin/env bash
# GPU benchmark, part 3 (not yet run): SparseDrive and GaussianFormer none vs max (issues 5, 6),
# MapTR accel=cpu and accel=torch (issue 4). Single GPU (pinned to GPU 0 on a 2-GPU host).
export LIMIT=${LIMIT:-540}; source scripts/device/lib.sh || exit 1
export CUDA_VISIBLE_DEVICES=0
run sparsedrive_max 150 model=sparsedrive accel=max bench.steps=60 bench.val_batches=4 bench.ceiling_steps=20 bench.ceiling_warmup_steps=5 ckpt=none
run gaussianformer_max 150 model=gaussianformer accel=max bench.steps=60 bench.val_batches=4 bench.ceiling_steps=20 bench.ceiling_warmup_steps=5 ckpt=none
run sparsedrive_none 110 model=sparsedrive accel=none bench.steps=25 bench.val_batches=0 bench.ceiling_steps=15 bench.ceiling_warmup_steps=5 ckpt=none
run gaussianformer_none 110 model=gaussianformer accel=none bench.steps=25 bench.val_batches=0 bench.ceiling_steps=15 bench.ceiling_warmup_steps=5 ckpt=none
run maptr_torch 90 model=maptr accel=torch bench.steps=60 bench.val_batches=0 bench.ceiling_steps=20 bench.ceiling_warmup_steps=5 ckpt=none
run maptr_cpu 90 model=maptr accel=cpu bench.steps=30 bench.val_batches=0 bench.ceiling_steps=20 bench.ceiling_warmup_steps=5 ckpt=none
run qcnet_max_compile_layers 150 model=qcnet accel=max model.net.compile_scope=layers bench.steps=200 bench.val_batches=0 bench.ceiling_steps=30 bench.ceiling_warmup_steps=5 ckpt=none
log "done in $(( $(date +%s) - START ))s"
