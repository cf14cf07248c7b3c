#!/usr/bin/env bash
# GPU benchmark, part 53 (2026-12-07, twenty-fifth session), issue 20: where QCNet `max`'s GPU time goes now.
#   LIMIT=560 bash scripts/device/bench53.sh p > /dev/null 2>&1; tr '\r' '\n' < $OUT/log.txt | grep -v "train step:\|it/s\]" | tail -c 9000
# (run tool timeout 590; av2's wheel carried: move ~15 tracked runs.tgz out of the checkout for the call)
#   p  QCNet `max` (the defaults of 2026-12-06: output heads in float32, the shape profile) with bench.profile=10 on
#      an empty Inductor cache (it fills the cache as bench52's training-only run did): the step's kernels by name,
#      GPU active time, the trace (b20's profile is from 29.9 samples/s; 63 samples/s since, device busy 94%); then
#      convergence seeds on that cache (SEEDS, default 2023 2024; CAP per seed, default 160)
#   m  MapTR nano `max` seeds 2023-2025 (bench51's part m; on an H200 its `none` runs of b39/b42 stand)
#   x  by the card that came: on an H200 part m, then p's profile in what is left (it fills the QCNet cache for a
#      part s in the next call); on an H100 part p
#   s  QCNet convergence seeds on p's cache (machine kept warm; SEEDS, default 2023 2024 2025; CAP, default 160)
#   g  QCNet `max` steps with the trajectory GRU compiled (model.net.compile_scope=layers_gru: unrolled for Inductor)
#      against cuDNN's (layers, the default; b53's profile: 10.5% of the kernel time), training only, 200 steps each on
#      one empty cache (the second compiles only what the first lacks), then layers again warm: median samples/s after warm-up, LIMIT 560
#      (first graph_count.py cuda: QCNet's graphs under CUDA bf16 autocast with the attention layers' input as given and
#      cast to float32, and whether the cast changes a number: ~1 min)
export LIMIT=${LIMIT:-560}; source scripts/device/lib.sh || exit 1
one_gpu_part "$1"
CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
log "card: $CARD"
profile_qcnet() {
  cold qcnet_p53
  run qcnet_max_profile "$1" model=qcnet accel=max $TRAIN_ONLY bench.steps=40 bench.profile=10
  grep -E "^(bottleneck|  evidence|  next|profile|  host in aten|  kernels|  GPU|  top)" "$RUNS/qcnet_max_profile.log" | tee -a "$OUT/log.txt"
  find "$RUNS" -name '*.pt.trace.json.gz' -size +12M -delete; bundle
}
maptr_seeds() {
  cold maptr-nano
  for s in 2023 2024 2025; do run maptr_nano_conv_max_s${s}_b53 120 $NANO accel=max seed=$s; curve maptr_nano_conv_max_s${s}_b53 val/mAP; done
}
[[ $PART == x ]] && { [[ $CARD == *H200* ]] && PART=xh || PART=p; }
case "$PART" in
  xh) maptr_seeds; profile_qcnet $(( $(left) - 40 )) ;;
  s) reuse_cache qcnet_p53; qcnet_seeds _p53 "${SEEDS:-2023 2024 2025}" "${CAP:-160}" ;;
  p) [[ $CARD == *H100* ]] && PCAP=${PCAP:-330}
     profile_qcnet "${PCAP:-260}"
     python3 - "$RUNS/qcnet_max_profile/summary.json" <<'PY' 2>&1 | tee -a "$OUT/log.txt"
import json, sys
p = json.load(open(sys.argv[1])).get("profile") or {}
for row in (p.get("top_kernels") or [])[:25]:
    print("  kernel", json.dumps(row)[:220])
PY
     qcnet_seeds _p53 "${SEEDS:-2023 2024}" "${CAP:-160}" ;;
  m) maptr_seeds ;;
  g) timeout 150 python3 scripts/device/graph_count.py cuda 2>&1 | tail -5 | tee -a "$OUT/log.txt"
     cold qcnet_g53
     for scope in layers layers_gru layers; do
       run qcnet_max_${scope}_g53_$(( $(date +%s) % 1000 )) 240 model=qcnet accel=max $TRAIN_ONLY bench.steps=200 model.net.compile_scope=$scope
     done ;;
  *) log "unknown part $PART (p, m, x, s, g)"; exit 2 ;;
esac
report
log "part $PART done in $(( $(date +%s) - START ))s"
