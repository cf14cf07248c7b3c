#!/usr/bin/env bash
# GPU check, part 46 (2026-12-06): the `shared GPU` verdict on a real GPU. Two bounded QCNet `none` runs side by
# side on the one GPU (100 measured steps, no ceiling, no validation), then the report over both: each summary's
# verdict should be `shared GPU` (the GPU held the other's memory beyond the run's own peak reservation) and the
# report should name both runs and label their machine "..., GPU shared".
#   LIMIT=200 bash scripts/device/bench46.sh > /dev/null 2>&1; tail -c 6000 $OUT/log.txt
export LIMIT=${LIMIT:-200}; source scripts/device/lib.sh || exit 1
log "commit $(revision), part 46"
SHORT="model=qcnet accel=none ckpt=none bench.ceiling=false bench.val_batches=0 bench.steps=100"
run qcnet_none_beside_a 170 $SHORT seed=2023 &
run qcnet_none_beside_b 170 $SHORT seed=2024 &
wait
for name in qcnet_none_beside_a qcnet_none_beside_b; do
  python3 - "$RUNS/$name/summary.json" <<'PY' 2>&1 | tee -a "$OUT/log.txt"
import json, sys
from drivebench.perf.bottleneck import gpu_memory_of_others_gb
s = json.load(open(sys.argv[1]))
b = s.get("bottleneck") or {}
print(sys.argv[1].split("/")[-2], "| others' GiB:", round(gpu_memory_of_others_gb(s) or -1, 1), "| verdict:", b.get("verdict"),
      "|", (b.get("evidence") or "")[:240])
PY
done
python3 -m drivebench.report "$RUNS/qcnet_none_beside_a" "$RUNS/qcnet_none_beside_b" --out "$OUT/report" 2>&1 | tr -s ' ' | head -12 | tee -a "$OUT/log.txt"
bundle
log "part 46 done in $(( $(date +%s) - START ))s"
