#!/usr/bin/env bash
# Sourced by the OpenMMLab device benchmarks after lib.sh: mmcv 2.1.0 with CUDA ops (a wheel built here
# before and put back into .whl/mm, else built from the sdist: 175-226 s on 32 cores) and the rest of
# the stack from .whl/mm, installed into .site.
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
