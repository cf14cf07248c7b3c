#!/usr/bin/env bash
# Install the OpenMMLab stack for model=mmdet3d / bench=mmengine into this checkout's venv: the
# openmmlab extra, mmcv 2.1.0 built once with its compiled ops (wheel cached under
# ${DRIVEBENCH_CACHE:-~/.cache/drivebench}/wheels/), mmdet 3.3.0 and mmdet3d 1.4.0 (without open3d).
# Arguments go to the installer: --check, --rebuild, --wheel-only, --jobs N. Doc: docs/openmmlab.md.
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-.venv/bin/python}" -m drivebench.openmmlab.install "$@"
