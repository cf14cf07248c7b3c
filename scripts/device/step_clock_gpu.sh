#!/usr/bin/env bash
# GPU check (issue 17 item 4; one H200): the step clock's CUDA path after the batch hooks and
# the device transform moved to the datamodule and the ceiling became a datamodule of its own.
# (1) the GPU tests of the step timer and the device prefetch; (2) MapTR accel=max on the mini set
# (device JPEG decode on the datamodule, CUDA-event spans), with and without device_prefetch: the
# summary's h2d / gpu_preprocess / ceiling figures and the run's one phase-tagged event stream.
export LIMIT=${LIMIT:-420}; source scripts/device/lib.sh || exit 1
export DRIVEBENCH_EXIT_TIMEOUT_S=20 CUDA_VISIBLE_DEVICES=0
log "=== pytest -m gpu (step timer, device prefetch)"
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_step_timer.py tests/test_device_prefetch.py \
  > "$RUNS/pytest_gpu.log" 2>&1
tail -4 "$RUNS/pytest_gpu.log" | tee -a "$OUT/log.txt"
M="model=maptr data.size=mini accel=max bench.steps=20 bench.warmup_steps=5 bench.ceiling_steps=10 bench.ceiling_warmup_steps=3 bench.val_batches=2 ckpt=none"
run maptr_max 150 $M
run maptr_max_prefetch 90 $M accel.device_prefetch=true
python3 - <<'PY' | tee -a "$OUT/log.txt"
import glob, json, os
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
for p in sorted(glob.glob("/tmp/runs/maptr_*/summary.json")):
    d = json.load(open(p)); t = d.get("train") or {}; c = d.get("ceiling") or {}
    med = lambda x, k: ((x.get(k) or {}).get("median"))
    print(os.path.basename(os.path.dirname(p)), "h2d", med(t, "h2d_s"), "device_h2d", med(t, "device_h2d_s"),
          "gpu_preprocess", med(t, "gpu_preprocess_s"), "data_wait", med(t, "data_wait_s"),
          "ceiling samples/s", c.get("samples_per_s"), "ceiling h2d", med(c, "h2d_s"),
          "efficiency", d.get("efficiency"), "prefetch", (d.get("data") or {}).get("device_prefetch"))
    files = glob.glob(os.path.join(os.path.dirname(p), "tb", "events.out.tfevents.*"))
    acc = EventAccumulator(files[0]); acc.Reload()
    print("  event files", len(files), "tag heads", sorted({t.split("/")[0] for t in acc.Tags()["scalars"]}))
PY
cp "$RUNS/pytest_gpu.log" "$OUT/" 2>/dev/null; bundle
log "done in $(( $(date +%s) - START ))s"
