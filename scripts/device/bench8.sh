#!/usr/bin/env bash
# GPU benchmark, part 8 (2-GPU host; single-GPU runs pinned to GPU 0), same code as part 7 plus the
# summary fields of 9bbadd5. MapTR on 2 GPUs with P2P on (issue 7; part 7's attempt hit its cap while
# both ranks compiled from a cold cache), MapTR accel=cpu (issue 4; part 7's cap was too short for
# its in-process CPU pipeline), MapTR checkpoint cost none / async / local with the none and async runs
# repeated and interleaved so run-to-run noise is visible (issue 8; a save every 18 steps, 4 saves).
export LIMIT=${LIMIT:-560}; source scripts/device/lib.sh || exit 1
export DRIVEBENCH_EXIT_TIMEOUT_S=20
run maptr_ddp2_p2p_on 130 model=maptr accel=max dist=ddp dist.devices=2 dist.p2p=on bench.steps=100 bench.val_batches=0 bench.ceiling=false ckpt=none
export CUDA_VISIBLE_DEVICES=0
run maptr_cpu 95 model=maptr accel=cpu bench.steps=12 bench.warmup_steps=4 bench.val_batches=0 bench.ceiling=false ckpt=none
C="model=maptr accel=max bench.steps=72 bench.val_batches=0 bench.ceiling=false"
K="ckpt.every_n_steps=18 ckpt.keep_last_k=2"
run maptr_ckpt_none_a 65 $C ckpt=none
run maptr_ckpt_async_a 65 $C ckpt=async $K
run maptr_ckpt_local 65 $C ckpt=local $K
run maptr_ckpt_none_b 65 $C ckpt=none
run maptr_ckpt_async_b 65 $C ckpt=async $K
log "done in $(( $(date +%s) - START ))s"
