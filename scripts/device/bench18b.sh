#!/usr/bin/env bash
# GPU part 18b (one H200): the graphed-loss GPU test with its full failure text, then
# scripts/device/qcnet_ops.py (QCNet's op profile, graphed step, segment-reduction micro-benchmarks).
source scripts/device/setup.sh || exit 1
mkdir -p "$OUT"
timeout 150 python3 -m pytest -q -x -p no:cacheprovider -m gpu --tb=short tests/test_qcnet_static_shapes.py > "$OUT/gputest.txt" 2>&1
tail -25 "$OUT/gputest.txt"
timeout 300 python3 scripts/device/qcnet_ops.py 2>&1 | tee "$OUT/qcnet_ops.txt" | grep -v "^-\{5\}" | cut -c1-200
