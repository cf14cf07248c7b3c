#!/usr/bin/env bash
# Issue 24 on a quiet host: `make run`'s command (QCNet, accel=max, accel.threads=auto) on a 2-core slice
# of the GPU machine (taskset, the GPU hidden: the CPU-only defaults), idle vs with one CPU-bound process
# pinned to the same two cores; then short runs of accel.threads=auto vs PyTorch's defaults, busy vs idle.
# The numbers are ratios within this one command (scripts/bench_threads.py prints them).
# Run: bash scripts/device/bench_threads.sh > /dev/null 2>&1; tail -c 11000 $OUT/log.txt   (with .whl carried)
source scripts/device/setup.sh || exit 1
mkdir -p "$OUT"
export CUDA_VISIBLE_DEVICES=
python3 -m pip install -q --no-index --no-deps --target .site .whl/threadpoolctl-*.whl 2>/dev/null || true
# the first run generates and preprocesses the mini set (not timed)
timeout 300 taskset -c 0,1 python3 -m drivebench model=qcnet accel=max bench.steps=2 bench.ceiling=false \
  bench.val_batches=0 hydra.run.dir=/tmp/bt-warm > "$OUT/warm.log" 2>&1
echo "warm-up rc=$?" >> "$OUT/log.txt"
timeout 280 taskset -c 0,1 python3 scripts/bench_threads.py --rounds 1 --out /tmp/bt-full >> "$OUT/log.txt" 2>&1
timeout 220 taskset -c 0,1 python3 scripts/bench_threads.py --rounds 2 --short --variants auto,default \
  --out /tmp/bt-short >> "$OUT/log.txt" 2>&1
echo "done rc=$?" >> "$OUT/log.txt"
