#!/usr/bin/env bash
# GPU benchmark, part 5 (single GPU): the GPU-only tests; MapTR and SparseDrive accel=max after the
# host-side fixes (JPEG bytes stay on the host, gc_freeze, device_prefetch); the nuScenes loader
# knob table at 1600x900 for the MapTR pipeline (issue 3).
export LIMIT=${LIMIT:-500}; source scripts/device/lib.sh || exit 1
export CUDA_VISIBLE_DEVICES=0
log "=== pytest -m gpu"
timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/ > "$RUNS/pytest_gpu.log" 2>&1
rc=$?; tail -4 "$RUNS/pytest_gpu.log" | tee -a "$OUT/log.txt"
NOPF=""; if (( rc != 0 )); then NOPF="accel.device_prefetch=false"; log "GPU tests failed: device_prefetch off below"; fi
run maptr_max 130 model=maptr accel=max $NOPF bench.steps=100 bench.val_batches=0 bench.ceiling_steps=30 bench.ceiling_warmup_steps=5 ckpt=none
run sparsedrive_max 170 model=sparsedrive accel=max $NOPF bench.steps=40 bench.val_batches=0 bench.ceiling_steps=15 bench.ceiling_warmup_steps=3 ckpt=none
L="bench=loader model=maptr"
run loader_none 40 $L accel=none bench.loader_batches=6
run loader_workers16 35 $L accel=none accel.num_workers=16 bench.loader_batches=30
run loader_torch_layer 35 $L accel=none accel.num_workers=16 accel.pin_memory=true accel.persistent_workers=true accel.prefetch_factor=4 bench.loader_batches=30
run loader_precompute_targets 40 $L accel=none accel.precompute_targets=true bench.loader_batches=6
run loader_device_decode 40 $L accel=none accel.device_transform=decode bench.loader_batches=15
run loader_max 40 $L accel=max bench.loader_batches=60
python3 - <<'PY' | tee -a "$OUT/log.txt"
import json, glob, os
for p in sorted(glob.glob("/tmp/runs/loader_*/summary.json")):
    d = json.load(open(p)); l = d.get("loader") or {}
    print(f"{os.path.basename(os.path.dirname(p)):28s} {l.get('samples_per_s', float('nan')):8.2f} samples/s  batch_s median {((l.get('batch_s') or {}).get('median') or float('nan')):.4f}")
PY
cp "$RUNS/pytest_gpu.log" "$OUT/" 2>/dev/null; bundle
log "done in $(( $(date +%s) - START ))s"
