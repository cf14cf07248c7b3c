#!/usr/bin/env bash
# GPU benchmark, part 11 (one H200, or GPU 0 of two): the OpenMMLab runner comparison of
# issue 11 on the H200. mmcv 2.1.0 with CUDA ops is built from the sdist in .whl/mm
# (scripts/device/openmmlab_wheels.sh; 175 s on 32 cores in part 10) unless a wheel built here before
# was put back into .whl/mm (the build is copied to $OUT for that). Then PointPillars at its config
# size on the embedded nuScenes set: mmengine's runner vs drivebench, accel=none and max, 30 steps each.
export LIMIT=${LIMIT:-570}; source scripts/device/lib.sh || exit 1
export DRIVEBENCH_EXIT_TIMEOUT_S=20 CUDA_VISIBLE_DEVICES=0
export PIP_NO_INDEX=1 PIP_FIND_LINKS=$PWD/.whl/mm TORCH_CUDA_ARCH_LIST=9.0 DRIVEBENCH_CACHE=/tmp/drivebench-cache
W=$(ls .whl/mm/mmcv-2.1.0-cp312-*.whl 2>/dev/null | head -1)
if [[ -z "$W" ]]; then
  mkdir -p /tmp/drivebench-cache/wheels/src && cp .whl/mm/mmcv-2.1.0.tar.gz /tmp/drivebench-cache/wheels/src/
  t0=$(date +%s)
  timeout -k 5 300 python3 -m drivebench.openmmlab.install --wheel-only --jobs "$(nproc)" >> "$OUT/log.txt" 2>&1
  log "build rc=$? in $(( $(date +%s) - t0 ))s"
  W=$(ls /tmp/drivebench-cache/wheels/*/mmcv-2.1.0-*.whl 2>/dev/null | head -1)
  [[ -n "$W" ]] && cp "$W" "$OUT/"
fi
[[ -n "$W" ]] || { log "no mmcv wheel"; exit 1; }
python3 -m pip install -q --no-index --no-deps --no-compile --target .site "$W" .whl/mm/mmengine*.whl .whl/mm/mmdet*.whl .whl/mm/lyft*.whl \
  .whl/mm/addict*.whl .whl/mm/yapf*.whl .whl/mm/terminaltables*.whl .whl/mm/trimesh*.whl .whl/mm/networkx*.whl \
  .whl/mm/platformdirs*.whl .whl/mm/termcolor*.whl .whl/mm/rich*.whl .whl/mm/markdown_it*.whl .whl/mm/mdurl*.whl \
  .whl/mm/regex*.whl --upgrade >> "$OUT/log.txt" 2>&1
# one command per job (a failing job must not take the others with it, as a multirun does)
mkdir -p "$RUNS/mm"
M="model=mmdet3d bench.steps=30 bench.warmup_steps=5 bench.ceiling=false bench.val_batches=0 ckpt=none"
run mm/0_mmengine_none 150 $M accel=none bench=mmengine  # the first also writes the mmdet3d infos
run mm/1_train_none 120 $M accel=none
run mm/2_train_max 180 $M accel=max
run mm/3_mmengine_max 180 $M accel=max bench=mmengine
run mm/4_train_none 90 $M accel=none  # repeats in the other order, as time allows
run mm/5_mmengine_none 90 $M accel=none bench=mmengine
timeout 20 python3 -m drivebench.openmmlab.compare "$RUNS/mm" >> "$OUT/log.txt" 2>&1
bundle
log "done in $(( $(date +%s) - START ))s"
