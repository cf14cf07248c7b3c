#!/usr/bin/env bash
# GPU benchmark, part 51 (2026-12-06, twenty-third session), issue 20: QCNet's lag at equal steps with the trajectory
# GRU in float32 (CUDA autocast ran cuDNN's GRU in float16, unscaled, under bf16-mixed: the refinement stage, which
# only that GRU feeds, is what trails: experiments/results/cpu2core-2026-12-06-qcnet-lag-by-variant), then MapTR.
#   LIMIT=565 bash scripts/device/bench51.sh a > /dev/null 2>&1; tr '\r' '\n' < $OUT/log.txt | grep -v "train step:\|it/s\]" | tail -c 9000
# (run tool timeout 595; av2's wheel carried: move ~7 MiB of tracked runs.tgz out of the checkout for the call)
#   a  QCNet `max` convergence with the float32 GRU: a training-only run fills an empty Inductor cache (FILL_CAP: 240 s
#      on an H200, 330 on an H100), then seeds 2023 and 2024 on it (CAP per seed, default 160)
#   b  more seeds on a's cache (machine kept warm; SEEDS, default 2025), then scripts/device/grad_fidelity.py (QCNet
#      after one epoch at none: each of `max`'s arithmetic knobs, and the GRU as before the fix, against fp32's
#      gradients on the same weights and batches, dropout off) in what is left
#   m  MapTR nano `max` seeds 2023 (cold), 2024, 2025 (bench49 d; on an H200: its `none` runs of b39/b42 stand)
export LIMIT=${LIMIT:-565}; source scripts/device/lib.sh || exit 1
one_gpu_part "$1"
CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
log "card: $CARD"
case "$PART" in
  a) [[ $CARD == *H100* ]] && FILL_CAP=${FILL_CAP:-330}
     CAP=${CAP:-160} qcnet_warm _gru32 "${SEEDS:-2023 2024}" ;;
  b) reuse_cache qcnet_gru32; qcnet_seeds _gru32 "${SEEDS:-2025}" "${CAP:-160}"
     if (( $(left) > 150 )); then
       log "=== grad_fidelity ($(left)s left)"
       timeout $(( $(left) - 20 )) python3 scripts/device/grad_fidelity.py cuda 1 8 $(( $(left) - 20 )) 2>&1 | grep "^{" | tee -a "$OUT/log.txt"
     fi ;;
  m) cold maptr-nano
     for s in 2023 2024 2025; do run maptr_nano_conv_max_s${s}_b51 120 $NANO accel=max seed=$s; curve maptr_nano_conv_max_s${s}_b51 val/mAP; done ;;
  *) log "unknown part $PART (a, b, m)"; exit 2 ;;
esac
report
log "part $PART done in $(( $(date +%s) - START ))s"
