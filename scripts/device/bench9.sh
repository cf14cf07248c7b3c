#!/usr/bin/env bash
# GPU benchmark, part 9 (2-GPU host, pinned to GPU 0): the two nuScenes loader knobs not yet measured
# alone (issue 3), the doctor on one GPU (issue 10), then the OpenMMLab attempt (issue 11): build mmcv
# 2.1.0 with its CUDA ops for sm_90 from the sdist carried in .whl/mm (no network here), through
# drivebench's own installer, inside what is left of this one command. SKIP_LOADERS=1 and DOCTOR_CAP
# serve bench10.sh (this script as part 10 ran it).
export LIMIT=${LIMIT:-570}; source scripts/device/lib.sh || exit 1
export DRIVEBENCH_EXIT_TIMEOUT_S=20
export CUDA_VISIBLE_DEVICES=0
L="bench=loader model=maptr"
[[ -n "${SKIP_LOADERS:-}" ]] || {
run loader_shm_cache 75 $L accel=none accel.shm_cache=true accel.preprocess_workers=16 bench.loader_batches=20
run loader_device_images 45 $L accel=none accel.device_transform=images bench.loader_batches=10
}
log "=== doctor (1 GPU)"
timeout -k 5 ${DOCTOR_CAP:-60} python3 -m drivebench.doctor model=maptr --json "$RUNS/doctor_1gpu.json" > "$RUNS/doctor_1gpu.txt" 2>&1
log "rc=$?"; cat "$RUNS/doctor_1gpu.txt" >> "$OUT/log.txt"; bundle
log "=== mmcv 2.1.0 build with CUDA ops ($(left)s left)"
export PIP_NO_INDEX=1 PIP_FIND_LINKS=$PWD/.whl/mm TORCH_CUDA_ARCH_LIST=9.0 DRIVEBENCH_CACHE=/tmp/drivebench-cache
mkdir -p /tmp/drivebench-cache/wheels/src && cp .whl/mm/mmcv-2.1.0.tar.gz /tmp/drivebench-cache/wheels/src/
t0=$(date +%s)
timeout -k 5 $(( $(left) - 60 )) python3 -m drivebench.openmmlab.install --wheel-only --jobs 32 >> "$OUT/log.txt" 2>&1
rc=$?; log "build rc=$rc in $(( $(date +%s) - t0 ))s"
find /tmp/drivebench-cache/wheels -name "build.log" -exec cp {} "$OUT/mmcv_build.log" \;
tail -c 1500 "$OUT/mmcv_build.log" >> "$OUT/log.txt" 2>/dev/null
W=$(ls /tmp/drivebench-cache/wheels/*/mmcv-2.1.0-*.whl 2>/dev/null | head -1)
if [[ -n "$W" ]]; then
  ls -la "$W" | tee -a "$OUT/log.txt"
  python3 -m pip install -q --no-index --no-deps --no-compile --target .site "$W" .whl/mm/*.whl >> "$OUT/log.txt" 2>&1
  timeout 40 python3 -c "import mmcv, mmcv.ops, torch; from mmcv.ops import Voxelization; import mmdet3d.models; print('mmcv', mmcv.__version__, 'ops ok; voxelize on cuda:', Voxelization([0.2,0.2,4],[0,-40,-3,70.4,40,1],32,1000)(torch.rand(100,4,device='cuda')*10)[0].shape)" >> "$OUT/log.txt" 2>&1
  log "import rc=$?"
fi
log "done in $(( $(date +%s) - START ))s"
