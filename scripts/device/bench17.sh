#!/usr/bin/env bash
# GPU benchmark, part 17 (not yet run; one H200): issue 19's step figures, part a. Each run's step time
# (median), peak device memory and the activation-checkpointing decision (settings.activation_checkpointing).
# (1) GaussianFormer gs25600 at its paper batch 1: accel=none (upstream's with_cp on) against accel=max
#     (auto: off on the H200), for the 3x target (2.75x before: 0.934 vs 2.57 samples/s, part 3);
# (2) SparseDrive small (batch 6): none with checkpointing on (upstream) and off, max with it off (auto)
#     and on (keep).
# Part b (bench17b.sh): the op benchmark, GaussianFormer at batch 2 and 4, and the pre-issue-19 step.
# Budget: a max run costs ~70-100 s of start-up and compilation (part 3), so ten runs do not fit one call.
export LIMIT=${LIMIT:-480}; source scripts/device/lib.sh || exit 1
export DRIVEBENCH_EXIT_TIMEOUT_S=20 CUDA_VISIBLE_DEVICES=0
source scripts/device/bench17_lib.sh
G="model=gaussianformer model.size=gs25600 $STEPS"
S="model=sparsedrive model.size=small $STEPS"
runs gf_b1_none 80 $G accel=none
runs gf_b1_max 110 $G accel=max
runs sd_none_cp 75 $S accel=none
runs sd_max_auto 100 $S accel=max
runs sd_max_cp 100 $S accel=max accel.activation_checkpointing=keep
runs sd_none_nocp 75 $S accel=none accel.activation_checkpointing=off
log "done in $(( $(date +%s) - START ))s"
