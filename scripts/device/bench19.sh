#!/usr/bin/env bash
# GPU benchmark, part 19 (issue 20, one H200): time to quality at accel=none and accel=max, and
# accel=auto against the best preset. One part per device call (each under ~9.5 minutes):
#   bash scripts/device/bench19.sh a > /dev/null 2>&1; tail -c 11000 $OUT/log.txt
#   a  QCNet convergence, accel=none, seed 2023      (~9 min: 5 epochs of 250 steps + validation at 88 s
#      per epoch, data generation on a fresh machine; 2026-12-02 side by side it was cut at step 1,113)
#   b  QCNet convergence, accel=max, seeds 2023 and 2024
#   c  QCNet convergence, accel=none, seed 2024
#   d  MapTR convergence, accel=none, seed 2023      (~7.5 min: 6 epochs of 48 steps + validation)
#   e  MapTR convergence, accel=max, seeds 2023 and 2024
#   f  MapTR convergence, accel=none, seed 2024
#   g  QCNet: accel=max, accel=auto, accel=auto with auto_numerics (default bounded runs)
#   h  MapTR: the same three
#   gh QCNet and MapTR: accel=max and accel=auto only (one call instead of two; auto_numerics left out)
#   n  a and d side by side, each pinned to 8 of the 16 cores (one call instead of two; both runs are
#      loader-bound in their training process, so each is compared with its standalone bounded-run
#      throughput in the log: the slowdown side by side is the bias against none, stated with the result)
#   m  the max runs of b and e for seed 2023 only, one after the other
# a, b, d, e give one seed of each setting (the 3x and final-metric figures); c and f add the second
# seed of none (the seed-to-seed spread the "same convergence" rule needs). Then copy every part's
# runs side by side and report them together (the runs recorded their targets):
#   python -m drivebench.report experiments/results/h200-<date>-b19 --out experiments/results/h200-<date>-b19/report
# SparseDrive and GaussianFormer are not here: their accel=none runs fit too few epochs in one call.
export LIMIT=${LIMIT:-588}; source scripts/device/lib.sh || exit 1
# a cap's SIGTERM stops at a step boundary and writes the summary (status interrupted) within the grace
export DRIVEBENCH_EXIT_TIMEOUT_S=20 CUDA_VISIBLE_DEVICES=0 KILL_GRACE=${KILL_GRACE:-15}
PART=${1:-a}

C="+experiment=convergence"
QM="val/minFDE val/cv_minFDE"
MM="val/mAP"
case "$PART" in
  a) run qcnet_conv_none_s2023 560 $C model=qcnet accel=none seed=2023; curve qcnet_conv_none_s2023 $QM ;;
  b) run qcnet_conv_max_s2023 270 $C model=qcnet accel=max seed=2023; curve qcnet_conv_max_s2023 $QM
     run qcnet_conv_max_s2024 270 $C model=qcnet accel=max seed=2024; curve qcnet_conv_max_s2024 $QM ;;
  c) run qcnet_conv_none_s2024 560 $C model=qcnet accel=none seed=2024; curve qcnet_conv_none_s2024 $QM ;;
  d) run maptr_conv_none_s2023 560 $C model=maptr accel=none seed=2023; curve maptr_conv_none_s2023 $MM ;;
  e) run maptr_conv_max_s2023 250 $C model=maptr accel=max seed=2023; curve maptr_conv_max_s2023 $MM
     run maptr_conv_max_s2024 250 $C model=maptr accel=max seed=2024; curve maptr_conv_max_s2024 $MM ;;
  f) run maptr_conv_none_s2024 560 $C model=maptr accel=none seed=2024; curve maptr_conv_none_s2024 $MM ;;
  n) export KILL_GRACE=25
     PIN=0-7 run qcnet_conv_none_s2023 545 $C model=qcnet accel=none seed=2023 &
     sleep 2; PIN=8-15 run maptr_conv_none_s2023 543 $C model=maptr accel=none seed=2023 &
     wait; bundle
     curve qcnet_conv_none_s2023 $QM; curve maptr_conv_none_s2023 $MM ;;
  m) run maptr_conv_max_s2023 230 $C model=maptr accel=max seed=2023; curve maptr_conv_max_s2023 $MM
     run qcnet_conv_max_s2023 300 $C model=qcnet accel=max seed=2023; curve qcnet_conv_max_s2023 $QM ;;
  g|h)
     M=$([[ $PART == g ]] && echo qcnet || echo maptr)
     B="model=$M ckpt=none"   # the default bounded run (10 warm-up + 300 steps, validation, ceiling)
     run ${M}_max 150 $B accel=max
     run ${M}_auto 200 $B accel=auto; trials ${M}_auto
     run ${M}_auto_numerics 200 $B accel=auto accel.auto_numerics=true; trials ${M}_auto_numerics ;;
  gh)
     for M in qcnet maptr; do
       B="model=$M ckpt=none"
       run ${M}_max 140 $B accel=max
       run ${M}_auto 160 $B accel=auto; trials ${M}_auto
     done ;;
  *) log "unknown part $PART (a-h, gh, m, n)"; exit 2 ;;
esac
report
log "part $PART done in $(( $(date +%s) - START ))s"
