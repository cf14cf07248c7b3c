#!/usr/bin/env bash
# GPU benchmark, part 50 (written 2026-12-06, twenty-first session; not run yet), issue 20: which of `max`'s
# arithmetic knobs makes QCNet trail `none` at equal steps (the report's comparison over every GPU run on record:
# 0.20 m of val minFDE behind at every epoch, 0.18 m on the H200, with equal losses; b49 ruled out the validation's
# precision, dropout under CUDA graphs and graphed optimizer steps). Each part runs `max` with one group of its
# arithmetic knobs taken back, two seeds; the report on the CPU then compares them with every `none` run on record
# (the gap at equal steps pools over machines: it is arithmetic, not speed):
#   python -m drivebench.report <these runs> <every QCNet none run on record> --out <dir>
# One part per call, av2's wheel carried (QCNet reads Argoverse 2 maps: move ~4 MiB of tracked runs.tgz out of the
# checkout for the call, experiments/README):
#   LIMIT=565 bash scripts/device/bench50.sh b > /dev/null 2>&1; tail -c 9000 $OUT/log.txt   (run tool timeout 595)
# Run b first (b50, twenty-second session: TF32 is not the knob; c ran): it needs no cache fill. a on an H100: the
# cold fill needs FILL_CAP=330 (b50: 240 s cut it), so `FILL_CAP=330 SEEDS=2023 ... a` in that call, then part
# a2 (seed 2024 on that cache) on the machine kept warm
#   a  fp32 arithmetic (precision 32-true, TF32 off; compile, CUDA graphs, padding, fused AdamW kept): a training-only
#      run fills an empty Inductor cache for these numerics, then seeds 2023 and 2024 on it (CAP per seed, default 170);
#      a2: more seeds of it on the machine kept warm (SEEDS, default 2024)
#   b  eager layers (compile off; bf16, TF32, graphs, padding kept): seeds 2023 and 2024, no compile to wait for
#      (b24: ~41 s per epoch graphed without compile, so ~230 s a run)
#   c  TF32 off (bf16, compile, graphs kept) on the cache a `bench39.sh c` call filled on this machine (kept warm):
#      more seeds (SEEDS, default 2025 2026; CAP per seed, default 160). Ran in b50 (with bench39 c): TF32 off still
#      lags (experiments/results/h100-2026-12-06-b50)
#   Reading: a lag gone in a and present in b points at bf16/TF32; present in a and gone in b, at Inductor's kernels;
#   present in both, at what both keep (padding, graphs, fused AdamW: the GPU tests cover graphs and the optimizer)
export LIMIT=${LIMIT:-580}; source scripts/device/lib.sh || exit 1
one_gpu_part "$1"
case "$PART" in
  a) CAP=${CAP:-170} qcnet_warm _fp32 "${SEEDS:-2023 2024}" accel.precision=32-true accel.tf32=false ;;
  a2) reuse_cache qcnet_fp32; qcnet_seeds _fp32 "${SEEDS:-2024}" "${CAP:-170}" accel.precision=32-true accel.tf32=false ;;
  b) qcnet_seeds _eager "${SEEDS:-2023 2024}" "${CAP:-250}" accel.compile=false ;;
  c) reuse_cache qcnet_notf32; qcnet_seeds _notf32 "${SEEDS:-2025 2026}" "${CAP:-160}" accel.tf32=false ;;
  *) log "unknown part $PART (a, a2, b, c)"; exit 2 ;;
esac
report
log "part $PART done in $(( $(date +%s) - START ))s"
