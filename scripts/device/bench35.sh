#!/usr/bin/env bash
# GPU benchmark, part 35 (issue 20, one H200): accel=auto with its live stages timed on the run's own steps
# (accel.auto_in_run=auto: on GPUs). One part per device call:
#   LIMIT=560 bash scripts/device/bench35.sh a > /dev/null 2>&1; tail -c 9000 $OUT/log.txt
#   a  MapTR: accel=auto accel.auto_numerics=true, then accel=max, training-only on one Inductor cache (empty
#      before the first): the trial's cost against the run (b32, every candidate a short fit: 38.2 s = 26%)
#      and auto's throughput against max's (b32: 0.968x)
#   b  QCNet: the same pair (b31: trial 47.0 s = 16.8%, auto 1.05x max of the session before)
#   c  QCNet: accel=auto alone, cold cache (when a device call cannot hold the pair; max: b30 58.1 samples/s)
export LIMIT=${LIMIT:-560}; source scripts/device/lib.sh || exit 1
one_gpu_part "$1"
T=$TRAIN_ONLY
case "$PART" in
  a) cold maptr; run maptr_auto 250 model=maptr $T accel=auto accel.auto_numerics=true; trials maptr_auto
     run maptr_max 200 model=maptr $T accel=max ;;
  b) cold qcnet; run qcnet_auto 330 model=qcnet $T accel=auto accel.auto_numerics=true; trials qcnet_auto; facts qcnet_auto
     run qcnet_max 200 model=qcnet $T accel=max; facts qcnet_max ;;
  c) cold qcnet; run qcnet_auto 330 model=qcnet $T accel=auto accel.auto_numerics=true; trials qcnet_auto; facts qcnet_auto ;;
  *) log "unknown part $PART (a, b, c)"; exit 2 ;;
esac
report
log "part $PART done in $(( $(date +%s) - START ))s"
