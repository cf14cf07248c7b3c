#!/usr/bin/env bash
# GPU benchmark, part 52 (2026-12-06, twenty-fourth session), issue 20: QCNet's two shortfalls against 3x sooner.
#   LIMIT=565 bash scripts/device/bench52.sh a > /dev/null 2>&1; tr '\r' '\n' < $OUT/log.txt | grep -v "train step:\|it/s\]" | tail -c 9000
# (run tool timeout 595; av2's wheel carried: move ~7 MiB of tracked runs.tgz out of the checkout for the call)
#   a  scripts/device/pgo_frames.py (does this torch find a module's frames in a later process's profile), then
#      QCNet `max` with its output heads in float32 (model.net.output_heads_fp32: the lag at equal steps, which
#      b51's float32 GRU did not remove; bf16 moves the gradient 2.5% on the same weights) and Dynamo's shape
#      profile kept between runs (accel.compile_shape_profile: the warm starts, 24-29 s in b51 with 2-6 of 40
#      graphs missing the cache): a training-only run fills an empty cache (FILL_CAP: 240 s on an H200, 330 on an
#      H100), then convergence seeds 2023 and 2024 on it (CAP per seed, default 160)
#   b  the GPU test of the float32 GRU (tests/test_qcnet_layers.py, never run on a GPU yet), then more seeds on a's
#      cache (machine kept warm; SEEDS, default 2025 2026): the third and fourth warm starts
# MapTR nano `max` on an H200 is bench51's part m (LIMIT=265).
export LIMIT=${LIMIT:-565}; source scripts/device/lib.sh || exit 1
one_gpu_part "$1"
CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
log "card: $CARD"
KNOBS="model.net.output_heads_fp32=true accel.compile_shape_profile=true"
case "$PART" in
  a) python3 scripts/device/pgo_frames.py 2>&1 | grep "^{" | tee -a "$OUT/log.txt"
     [[ $CARD == *H100* ]] && FILL_CAP=${FILL_CAP:-330}
     CAP=${CAP:-160} qcnet_warm _h32pgo "${SEEDS:-2023 2024}" $KNOBS ;;
  b) timeout 90 python3 -m pytest -q -p no:cacheprovider -m gpu --tb=line tests/test_qcnet_layers.py > "$OUT/pytest_gpu.txt" 2>&1
     grep -E "passed|failed|FAILED|Error" "$OUT/pytest_gpu.txt" | tail -4 | tee -a "$OUT/log.txt"
     reuse_cache qcnet_h32pgo; qcnet_seeds _h32pgo "${SEEDS:-2025 2026}" "${CAP:-160}" $KNOBS ;;
  *) log "unknown part $PART (a, b)"; exit 2 ;;
esac
report
log "part $PART done in $(( $(date +%s) - START ))s"
