#!/usr/bin/env bash
# Shared by bench17.sh and bench17b.sh: bounded training runs (no validation, no ceiling, no checkpoints)
# and, after each, the summary's checkpointing decision and peak memory in the log.
STEPS="bench.steps=15 bench.warmup_steps=5 bench.val_batches=0 bench.ceiling=false ckpt=none"
runs() {  # runs NAME CAP overrides...: lib.sh's run, then the summary fields this part is about
  local name=$1
  run "$@"
  python3 - "$RUNS/$name/summary.json" <<'PY' 2>/dev/null | tee -a "$OUT/log.txt"
import json, sys
s = json.load(open(sys.argv[1]))
ac, mem, train = s["settings"].get("activation_checkpointing", {}), s.get("memory", {}), s.get("train", {})
step = (train.get("step_s") or {}).get("median")
print(f"  batch {s['settings']['batch_size']}: step median {step:.3f} s, {train.get('samples_per_s', float('nan')):.3f} samples/s, "
      f"peak {mem.get('peak_device_gb', float('nan')):.1f} GiB (reserved {mem.get('peak_device_reserved_gb', float('nan')):.1f}); "
      f"checkpointing {ac.get('enabled')} ({ac.get('reason')})")
PY
}
