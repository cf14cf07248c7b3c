#!/usr/bin/env bash
# GPU benchmark, part 30 (issue 20, one H200): the third seed of QCNet's convergence and a bf16-off
# ablation of max (the final metric only: the three runs share the GPU and the cores, so their
# times are not time-to-target figures), then accel=auto (the trial redesigned: compile judged on
# the run's own steps) against accel=max at the default bounded run. One part per device call:
#   bash scripts/device/bench30.sh a > /dev/null 2>&1; tail -c 9000 $OUT/log.txt
#   a  QCNet +experiment=convergence side by side: accel=none seed 2025 (cores 0-3), accel=max seed
#      2025 (cores 4-9), accel=max accel.precision=32-true seed 2023 (cores 10-15: which of max's
#      knobs moves the final metric; compare with max seed 2023 of part 29)
#   b  QCNet: accel=auto accel.auto_numerics=true at the default bounded run (ckpt=none) on an empty
#      Inductor cache (its run pays the cold compile), then accel=max on the cache it left (max's
#      steady-state steps are what auto is compared with; its wall time is not)
#   c  MapTR: the same pair
export LIMIT=${LIMIT:-588}; source scripts/device/lib.sh || exit 1
export DRIVEBENCH_EXIT_TIMEOUT_S=20 CUDA_VISIBLE_DEVICES=0 KILL_GRACE=${KILL_GRACE:-20}
PART=${1:-a}
C="+experiment=convergence model=qcnet"
QM="val/minFDE val/cv_minFDE"
case "$PART" in
  a) PIN=0-3 run qcnet_conv_none_s2025 572 $C accel=none seed=2025 &
     sleep 20; PIN=4-9 run qcnet_conv_max_s2025 540 $C accel=max seed=2025 &
     sleep 2; PIN=10-15 run qcnet_conv_max32_s2023 540 $C accel=max accel.precision=32-true seed=2023 &
     wait; bundle
     for r in qcnet_conv_none_s2025 qcnet_conv_max_s2025 qcnet_conv_max32_s2023; do curve $r $QM; done ;;
  b|c) m=$([[ $PART == b ]] && echo qcnet || echo maptr)
     cold $m; run ${m}_auto 330 model=$m ckpt=none accel=auto accel.auto_numerics=true; trials ${m}_auto
     run ${m}_max 200 model=$m ckpt=none accel=max ;;
  *) log "unknown part $PART (a, b, c)"; exit 2 ;;
esac
report
log "part $PART done in $(( $(date +%s) - START ))s"
