#!/usr/bin/env bash
# GPU benchmark, part 51 (2026-12-06, twenty-third session), issue 20: one script for whichever card comes.
#   LIMIT=565 bash scripts/device/bench51.sh a > /dev/null 2>&1; tr '\r' '\n' < $OUT/log.txt | grep -v "train step:\|it/s\]" | tail -c 9000
# (run tool timeout 595; av2's wheel carried: move ~7 MiB of tracked runs.tgz out of the checkout for the call)
#   a  on an H200: MapTR nano `max` seeds 2023 (cold), 2024, 2025 (bench49 d: the H200's `none` runs of b39/b42
#      decoded on the CPU and stand); then, on any card, scripts/device/grad_fidelity.py (QCNet after one epoch at
#      none: each of `max`'s arithmetic knobs against fp32's gradients on the same weights and batches, dropout off)
#   b  QCNet `max` with compile off (bench50 b), SEEDS (default 2023 2024): is Inductor behind `max`'s lag?
#      then graph_count.py if time is left
#   c  QCNet `max` in fp32 (bench50 a: compile kept, bf16 and TF32 off) on an empty cache, SEEDS (default 2023)
export LIMIT=${LIMIT:-565}; source scripts/device/lib.sh || exit 1
one_gpu_part "$1"
CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
log "card: $CARD"
eager_seeds() { qcnet_seeds _eager "$1" "${CAP:-250}" accel.compile=false; }
case "$PART" in
  a) if [[ $CARD == *H200* ]]; then
       cold maptr-nano
       for s in 2023 2024 2025; do run maptr_nano_conv_max_s${s}_b51 120 $NANO accel=max seed=$s; curve maptr_nano_conv_max_s${s}_b51 val/mAP; done
     fi
     log "=== grad_fidelity ($(left)s left)"
     timeout $(( $(left) - 20 )) python3 scripts/device/grad_fidelity.py cuda 1 8 $(( $(left) - 20 )) 2>&1 | grep "^{" | tee -a "$OUT/log.txt" ;;
  b) eager_seeds "${SEEDS:-2023 2024}"
     if (( $(left) > 90 )); then
       log "=== graph_count ($(left)s left)"
       timeout $(( $(left) - 20 )) python3 scripts/device/graph_count.py cuda 2>&1 | tail -20 | tee -a "$OUT/log.txt"
     fi ;;
  c) FILL_CAP=${FILL_CAP:-330} CAP=${CAP:-170} qcnet_warm _fp32 "${SEEDS:-2023}" accel.precision=32-true accel.tf32=false ;;
  *) log "unknown part $PART (a, b, c)"; exit 2 ;;
esac
report
log "part $PART done in $(( $(date +%s) - START ))s"
