#!/usr/bin/env bash
# The runner comparison of docs/openmmlab.md: the same mmdet3d config, model size, data and batch size
# trained by mmengine's own Runner (bench=mmengine) and by drivebench (bench=train), at accel=none and
# accel=max, each repeated; then the report and the ratios (drivebench / mmengine, max / none).
#
#   scripts/bench_openmmlab.sh [OUT_DIR] [extra overrides...]
#   e.g. scripts/bench_openmmlab.sh outputs/openmmlab-compare model.size=config data.size=bench
#
# Defaults follow the machine (model.size test and data.size mini on CPUs); steps: bench.steps (auto).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
OUT=${1:-outputs/openmmlab-compare/$(date +%Y-%m-%d_%H-%M-%S)}
shift || true
REPEATS=${REPEATS:-3}

"$PY" -m drivebench.openmmlab.install                       # a no-op once the stack imports
reps=$(seq -s, 1 "$REPEATS")
# +repeat is only a sweep axis (repeats side by side in the report); ckpt=none and no validation or
# ceiling: both runners do the same work, training iterations only
"$PY" -m drivebench -m model=mmdet3d "+repeat=$reps" accel=none,max bench=mmengine,train \
  bench.ceiling=false bench.val_batches=0 ckpt=none "hydra.sweep.dir=$OUT" \
  'hydra.sweep.subdir=${hydra.job.num}_${bench.mode}_${accel.name}' "$@"
"$PY" -m drivebench.report "$OUT" --out "$OUT/report" >/dev/null
"$PY" -m drivebench.openmmlab.compare "$OUT"
