#!/usr/bin/env bash
# GPU benchmark, part 16 (not yet run; one H200): issue 18 items 1-2. QCNet at accel=max and
# accel=none with bench.profile=10 (torch.profiler over 10 steps after warm-up; those steps and the
# profiler's warm-up step are left out of the statistics), 40 measured steps each, a short ceiling.
# Each summary's `profile` block puts the profiler's kernels per step and GPU active time beside
# NVML busy and the CUDA-event span of the same steps; its `bottleneck` block names the verdict.
# Run dirs (summaries, TensorBoard, traces up to 10 MB) come back in $OUT/runs.tgz; larger traces
# are removed before packing (their size is logged). Afterwards, on the CPU machine:
#   python -m drivebench.report <unpacked runs>   (the bottleneck column and section)
export LIMIT=${LIMIT:-565}; source scripts/device/lib.sh || exit 1
export DRIVEBENCH_EXIT_TIMEOUT_S=20 CUDA_VISIBLE_DEVICES=0
TRACE_MAX_MB=10
# profile NAME CAP overrides...: one run, then its profile and verdict rows into the log
profile() {
  local name=$1
  run "$@"
  grep -E "^(steps measured|bottleneck|  evidence|  next|  also|profile|  host in aten|  kernels|  GPU|  top)" \
    "$RUNS/$name.log" | tee -a "$OUT/log.txt"
  find "$RUNS" -name '*.pt.trace.json.gz' -size +${TRACE_MAX_MB}M | while read -r trace; do
    log "trace over ${TRACE_MAX_MB} MB, not packed: $trace ($(du -h "$trace" | cut -f1))"
    rm -f "$trace"
  done
  bundle
}
Q="model=qcnet bench.profile=10 bench.warmup_steps=10 bench.steps=40 bench.val_batches=0 bench.ceiling_steps=20 ckpt=none"
profile qcnet_max_profile 260 $Q accel=max
profile qcnet_none_profile 230 $Q accel=none
python3 - "$RUNS" <<'EOF' 2>&1 | tee -a "$OUT/log.txt"
import json, pathlib, sys
for path in sorted(pathlib.Path(sys.argv[1]).glob("*/summary.json")):
    s = json.loads(path.read_text())
    p = s.get("profile") or {}
    print(path.parent.name, json.dumps({"bottleneck": s.get("bottleneck"), "compare": p.get("compare"),
          "gpu": p.get("gpu"), "host": p.get("host"), "top_kernels": (p.get("top_kernels") or [])[:5],
          "top_ops": (p.get("top_ops") or [])[:5]}, indent=1))
EOF
log "done in $(( $(date +%s) - START ))s"
