#!/usr/bin/env bash
# GPU benchmark, part 59 (written 2026-12-07, thirtieth session; its first form of s ran that session on one H100,
# experiments/results/h100-2026-12-07-b59/), issue 20: SparseDrive's `max` step. b59 found `grid_sample` on float32
# locations at 0.648 s / 36.6 GiB a step and the op's own compiled form at 0.576 s / 19.6 GiB on one H100; since then
# SparseDrive's defaults compile each layer's aggregation as a unit (`model.net.compile_scope=aggregation`,
# `aggregation=auto`: the corner gathers traced into the unit), not yet timed. Its profiler run was cut before the
# trace's kernels were written: GPU time by kernel is still unknown.
#   bash scripts/device/bench59.sh s > /dev/null 2>&1; tr '\r' '\n' < $OUT/log.txt | grep -v "train step:\|it/s\]" | tail -c 9000
# (run tool timeout 595; no QCNet: set av2's wheel aside)
#   s  SparseDrive small `max`, training only, STEPS (default 60) steps each on one emptied cache: as configured
#      (the dfa units), the op's own compile in eager heads (b59's 0.576 s), the setting before b59
#      (`compile_scope=encoder aggregation=grid_sample`), and EXTRA's overrides if set (~480 s on an H100; EXTRA
#      only with LIMIT raised or STEPS lowered)
#   p  as configured under torch.profiler (bench.profile=3, 20 steps, on s's cache, a 300-s cap: the export of b59's
#      trace did not fit 120 s): the trace's top kernels in the summary, the trace kept if under 40 MB
# Then SparseDrive's time to quality on the new defaults: `bash scripts/device/bench39.sh h` (convergence max).
export LIMIT=${LIMIT:-565}; source scripts/device/lib.sh || exit 1
one_gpu_part "$1"
# trim_trace RUN: a trace over 40 MB stays behind (the summary keeps its top kernels), so runs.tgz comes back
trim_trace() { find "$RUNS/$1" -name "*.trace.json.gz" -size +40M -print -delete | tee -a "$OUT/log.txt"; bundle; }
SD="model=sparsedrive $TRAIN_ONLY accel=max bench.steps=${STEPS:-60}"
case "$PART" in
  s) cold sd59
     run sd_max 220 $SD  # the cold compile of the encoder and the dfa units comes first
     run sd_max_opcompiled 120 $SD model.net.compile_scope=encoder model.net.aggregation=compiled
     run sd_max_before 110 $SD model.net.compile_scope=encoder model.net.aggregation=grid_sample
     [[ -n ${EXTRA:-} ]] && run sd_max_extra 120 $SD $EXTRA ;;
  p) reuse_cache sd59
     run sd_max_prof 300 model=sparsedrive $TRAIN_ONLY accel=max bench.steps=20 bench.profile=3; trim_trace sd_max_prof ;;
  *) log "unknown part $PART (s, p)"; exit 2 ;;
esac
report
log "part $PART done in $(( $(date +%s) - START ))s"
