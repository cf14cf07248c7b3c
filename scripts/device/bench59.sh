#!/usr/bin/env bash
# GPU benchmark, part 59 (written 2026-12-07, thirtieth session; not run yet), issue 20: SparseDrive's `max` step on
# the float32 sampling (the deformable ops sample bf16 features at float32 locations since the twenty-ninth session:
# a float32 copy of each sampled level kept for backward, ~6.6 GB a step more by arithmetic) against b57's 0.504 s /
# 30.0 GiB, and where its GPU time goes. SparseDrive's `max` is 2.87x `none` epoch for epoch (b48), device-bound
# (GPU busy 86-96%, b57): 3x sooner needs a shorter GPU step, and no profile of it is on record.
#   bash scripts/device/bench59.sh s > /dev/null 2>&1; tr '\r' '\n' < $OUT/log.txt | grep -v "train step:\|it/s\]" | tail -c 9000
# (run tool timeout 595; no QCNet: set av2's wheel aside)
#   s  SparseDrive small `max`, training only, STEPS (default 100) steps each on one emptied cache: as configured,
#      as configured under torch.profiler (bench.profile=3: the trace's top kernels in the summary), the compiled
#      aggregation (b57: 0.493 s, 19.6 GiB), and EXTRA runs' overrides if set (~480 s on an H100)
export LIMIT=${LIMIT:-565}; source scripts/device/lib.sh || exit 1
one_gpu_part "$1"
# trim_trace RUN: a trace over 40 MB stays behind (the summary keeps its top kernels), so runs.tgz comes back
trim_trace() { find "$RUNS/$1" -name "*.trace.json.gz" -size +40M -print -delete | tee -a "$OUT/log.txt"; bundle; }
SD="model=sparsedrive $TRAIN_ONLY accel=max bench.steps=${STEPS:-100}"
case "$PART" in
  s) cold sd59
     run sd_max 160 $SD; run sd_max_prof 120 $SD bench.profile=3; trim_trace sd_max_prof; run sd_max_agg 110 $SD model.net.aggregation=compiled
     [[ -n ${EXTRA:-} ]] && run sd_max_extra 110 $SD $EXTRA ;;
  *) log "unknown part $PART (s)"; exit 2 ;;
esac
report
log "part $PART done in $(( $(date +%s) - START ))s"
