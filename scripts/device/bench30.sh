#!/usr/bin/env bash
# GPU benchmark, part 30 (issue 20, one H200): the third seed of QCNet's convergence and a bf16-off
# ablation of max (the final metric only: the three runs share the GPU and the cores, so their
# times are not time-to-target figures), then accel=auto (the trial redesigned: compile judged on
# the run's own steps) against accel=max at the default bounded run. One part per device call:
#   bash scripts/device/bench30.sh a > /dev/null 2>&1; tail -c 9000 $OUT/log.txt
#   a  QCNet +experiment=convergence side by side: accel=none seed 2025 (cores 0-3), accel=max seed
#      2025 (cores 4-9), accel=max accel.precision=32-true seed 2023 (cores 10-15: which of max's
#      knobs moves the final metric; compare with max seed 2023 of part 29)
#   b  accel=auto accel.auto_numerics=true against accel=max at the default bounded run (ckpt=none),
#      QCNet then MapTR; each run with its own empty Inductor cache (both pay a cold compile)
export LIMIT=${LIMIT:-588}; source scripts/device/lib.sh || exit 1
export DRIVEBENCH_EXIT_TIMEOUT_S=20 CUDA_VISIBLE_DEVICES=0 KILL_GRACE=${KILL_GRACE:-20}
PART=${1:-a}
C="+experiment=convergence model=qcnet"
QM="val/minFDE val/cv_minFDE"
cold() { export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-$1; rm -rf "$TORCHINDUCTOR_CACHE_DIR"; }
case "$PART" in
  a) PIN=0-3 run qcnet_conv_none_s2025 572 $C accel=none seed=2025 &
     sleep 20; PIN=4-9 run qcnet_conv_max_s2025 540 $C accel=max seed=2025 &
     sleep 2; PIN=10-15 run qcnet_conv_max32_s2023 540 $C accel=max accel.precision=32-true seed=2023 &
     wait; bundle
     for r in qcnet_conv_none_s2025 qcnet_conv_max_s2025 qcnet_conv_max32_s2023; do curve $r $QM; done ;;
  b) for m in qcnet maptr; do
       cold ${m}_max; run ${m}_max 200 model=$m ckpt=none accel=max
       cold ${m}_auto; run ${m}_auto 260 model=$m ckpt=none accel=auto accel.auto_numerics=true; trials ${m}_auto
     done ;;
  *) log "unknown part $PART (a, b)"; exit 2 ;;
esac
report
log "part $PART done in $(( $(date +%s) - START ))s"
