#!/usr/bin/env bash
# Fetch what an mmcv build and the OpenMMLab stack need on the GPU machine (no network there) into
# .whl/mm/ (git-ignored, carried with .whl): the mmcv 2.1.0 sdist, the build tools and the
# pure-Python / cp312 wheels of mmengine, mmdet, mmdet3d and their dependencies that the machine
# lacks (it has numpy, numba, opencv, matplotlib, scipy). On the machine:
#   PIP_NO_INDEX=1 PIP_FIND_LINKS=$PWD/.whl/mm TORCH_CUDA_ARCH_LIST=9.0 \
#     python3 -m drivebench.openmmlab.install --wheel-only --jobs 32      # 175 s on 32 cores
#   python3 -m pip install --no-index --no-deps --target .site <built wheel> .whl/mm/*.whl
# (scripts/device/bench10.sh does both.) llvmlite (58 MB) is left out: the 64 MiB carry limit.
set -uo pipefail
top=$(git rev-parse --show-toplevel) || exit 1
cd "$top" && mkdir -p .whl/mm
plat=(); for n in 17 24 27 28 31 34 35; do plat+=(--platform "manylinux_2_${n}_x86_64"); done
plat+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64)
for p in mmengine==0.10.7 mmdet==3.3.0 mmdet3d==1.4.0 lyft_dataset_sdk==0.0.8 addict yapf terminaltables networkx \
         trimesh platformdirs "setuptools<70" wheel ninja packaging termcolor rich markdown-it-py mdurl pygments regex; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${plat[@]}" \
    -d .whl/mm "$p" 2>/dev/null || echo "no wheel for $p" >&2
done
ls .whl/mm/mmcv-2.1.0.tar.gz >/dev/null 2>&1 ||
  python3 -m pip download -q --no-deps --no-binary :all: --no-build-isolation -d .whl/mm mmcv==2.1.0 2>/dev/null ||
  echo "no mmcv sdist (needs setuptools<70 to download)" >&2
du -sh .whl/mm
