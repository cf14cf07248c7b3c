#!/usr/bin/env bash
# GPU benchmark, part 29 (issue 20, one H200): QCNet time to quality with the compiled-layer max
# (issue 18), two seeds of each setting, and accel=auto against max. One part per device call:
#   bash scripts/device/bench29.sh a > /dev/null 2>&1; tail -c 9000 $OUT/log.txt
#   a  QCNet convergence accel=max, seed 2023 (a fresh machine: Inductor's cache cold, so the run
#      compiles every layer) then seed 2024 (the same machine: Inductor's on-disk cache warm)
#   b  QCNet convergence accel=none, seeds 2023 and 2024 side by side, pinned to cores 0-7 / 8-15 of
#      the one GPU (accel=none loads in the training process; each run's training throughput is
#      printed to compare with a standalone none run's 12.65 samples/s, the bias against none)
#   c  accel=auto against accel=max at the default bounded run: QCNet (auto, its max is in part 28),
#      then MapTR (max, auto)
# Then the parts' runs side by side, reported with their recorded targets:
#   python -m drivebench.report experiments/results/h200-<date>-b29 --out .../report
export LIMIT=${LIMIT:-588}; source scripts/device/lib.sh || exit 1
export DRIVEBENCH_EXIT_TIMEOUT_S=20 CUDA_VISIBLE_DEVICES=0 KILL_GRACE=${KILL_GRACE:-20}
PART=${1:-a}
C="+experiment=convergence model=qcnet"
QM="val/minFDE val/cv_minFDE"
case "$PART" in
  a) run qcnet_conv_max_s2023 390 $C accel=max seed=2023; facts qcnet_conv_max_s2023; curve qcnet_conv_max_s2023 $QM
     run qcnet_conv_max_s2024 300 $C accel=max seed=2024; facts qcnet_conv_max_s2024; curve qcnet_conv_max_s2024 $QM ;;
  b) PIN=0-7 run qcnet_conv_none_s2023 572 $C accel=none seed=2023 &
     sleep 3; PIN=8-15 run qcnet_conv_none_s2024 570 $C accel=none seed=2024 &
     wait; bundle
     curve qcnet_conv_none_s2023 $QM; curve qcnet_conv_none_s2024 $QM ;;
  c) run qcnet_auto 230 model=qcnet ckpt=none accel=auto; trials qcnet_auto; facts qcnet_auto
     run maptr_max 140 model=maptr ckpt=none accel=max
     run maptr_auto 170 model=maptr ckpt=none accel=auto; trials maptr_auto ;;
  *) log "unknown part $PART (a, b, c)"; exit 2 ;;
esac
report
log "part $PART done in $(( $(date +%s) - START ))s"
