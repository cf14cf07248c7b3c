#!/usr/bin/env bash
# GPU benchmark, part 7 (2-GPU host; single-GPU runs pinned to GPU 0). MapTR after two changes:
# the device transform's per-pixel chain compiled (accel.compile) and loader workers prefetching
# across epoch boundaries (accel.prefetch_across_epochs). 150 steps = 3 epoch boundaries of the
# 192-sample set inside the measured window. Then MapTR accel=torch / accel=cpu (issue 4) and MapTR
# on 2 GPUs with P2P on and off (issue 7; the 1-GPU reference is maptr_max here). Last, a probe of
# what an mmcv build would find on this machine (issue 11).
export LIMIT=${LIMIT:-565}; source scripts/device/lib.sh || exit 1
export DRIVEBENCH_EXIT_TIMEOUT_S=20
export CUDA_VISIBLE_DEVICES=0
M="model=maptr bench.val_batches=0 ckpt=none"
run maptr_max 120 $M accel=max bench.steps=150 bench.ceiling_steps=30 bench.ceiling_warmup_steps=5
run maptr_torch 105 $M accel=torch bench.steps=40 bench.ceiling=false
run maptr_cpu 70 $M accel=cpu bench.steps=20 bench.ceiling=false
unset CUDA_VISIBLE_DEVICES
D="model=maptr accel=max dist=ddp dist.devices=2 bench.steps=100 bench.val_batches=0 bench.ceiling=false ckpt=none"
run maptr_ddp2_p2p_on 105 $D dist.p2p=on
run maptr_ddp2_p2p_off 105 $D dist.p2p=off
log "=== probe for an mmcv build (issue 11)"
{ which nvcc; ls -d /usr/local/cuda*/bin/nvcc 2>&1; nvcc --version 2>&1 | tail -2; gcc --version | head -1; which ninja;
  python3 -c "import numba; print('numba', numba.__version__)" 2>&1 | tail -1;
  python3 -c "import numpy, cv2, matplotlib, scipy; print('numpy', numpy.__version__, 'cv2', cv2.__version__, 'mpl', matplotlib.__version__, 'scipy', scipy.__version__)" 2>&1 | tail -1;
  python3 -c "import torch; print('torch cuda', torch.version.cuda, 'arch', torch.cuda.get_arch_list())";
  python3 -c "import sysconfig; print(sysconfig.get_paths()['purelib'])"; nproc; } >> "$OUT/log.txt" 2>&1
log "done in $(( $(date +%s) - START ))s"
