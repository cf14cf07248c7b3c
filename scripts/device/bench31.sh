#!/usr/bin/env bash
# GPU benchmark, part 31 (issue 20, one H200): accel=auto against accel=max after the trial started
# from max's loader pipeline (prefetch 4, pinned batches, the device transform) and stopped trying a
# worker count within 2 x margin of auto's (b30: auto waited for data 14% of QCNet's compiled step and
# 9% of MapTR's, max 1% and 0.4%). One part per device call:
#   LIMIT=590 bash scripts/device/bench31.sh b > /dev/null 2>&1; tail -c 9000 $OUT/log.txt
#   b  QCNet: accel=auto accel.auto_numerics=true at the default bounded run (ckpt=none) on an empty
#      Inductor cache (its run pays the cold compile, as a user's first run does), then accel=max on
#      the cache it left, training only (its steady-state steps are what auto is compared with)
#   c  MapTR: the same pair
#   a  = bench30.sh a (QCNet convergence: third seed of none and max, max with bf16 off)
#   d  (after a, whose max seed 2025 ran out of GPU memory beside the other two runs) QCNet: auto as in b on
#      an empty Inductor cache, then the convergence run of max seed 2025 alone on the cache it left
#   e  MapTR: auto (training only: no ceiling phase) on an empty cache, then max training-only on its cache
export LIMIT=${LIMIT:-588}; source scripts/device/lib.sh || exit 1
export DRIVEBENCH_EXIT_TIMEOUT_S=20 CUDA_VISIBLE_DEVICES=0 KILL_GRACE=${KILL_GRACE:-20}
PART=${1:-b}
log "commit $(revision), part $PART"
case "$PART" in
  a) exec bash scripts/device/bench30.sh a ;;
  b|c) m=$([[ $PART == b ]] && echo qcnet || echo maptr)
     cold $m; run ${m}_auto 360 model=$m ckpt=none accel=auto accel.auto_numerics=true; trials ${m}_auto
     run ${m}_max 200 model=$m ckpt=none accel=max bench.ceiling=false bench.val_batches=0 ;;
  d) cold qcnet; run qcnet_auto 340 model=qcnet ckpt=none accel=auto accel.auto_numerics=true; trials qcnet_auto
     run qcnet_conv_max_s2025 300 +experiment=convergence model=qcnet accel=max seed=2025
     curve qcnet_conv_max_s2025 val/minFDE val/cv_minFDE ;;
  e) cold maptr; run maptr_auto 250 model=maptr ckpt=none accel=auto accel.auto_numerics=true bench.ceiling=false
     trials maptr_auto
     run maptr_max 200 model=maptr ckpt=none accel=max bench.ceiling=false bench.val_batches=0 ;;
  *) log "unknown part $PART (a, b, c, d, e)"; exit 2 ;;
esac
report
log "part $PART done in $(( $(date +%s) - START ))s"
