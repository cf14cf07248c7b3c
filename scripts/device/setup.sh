#!/usr/bin/env bash
# Source on the GPU machine: installs the carried wheels (.whl/) into .site and sets PYTHONPATH.
# Keeps NVLink multicast off (the machine's shared GPUs require it).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target .site .whl/*.whl >/dev/null 2>&1 \
  || { echo "wheel install failed"; return 1 2>/dev/null || exit 1; }
export PYTHONPATH=$PWD/.site:$PWD
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export DRIVEBENCH_CACHE=${DRIVEBENCH_CACHE:-/tmp/drivebench-cache}
export PYTHONUNBUFFERED=1
python3 -c "import torch, lightning; print('torch', torch.__version__, 'lightning', lightning.__version__, 'gpus', torch.cuda.device_count(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')"
